//! IO500 results as text (IO500's own format), JSON and CSV, and a comparison of targets.

use super::{Io500Result, Measurement, PHASES, Phase};

/// One `[RESULT]` line, as IO500 prints it.
pub fn result_line(measurement: &Measurement) -> String {
    format!(
        "[RESULT] {:>20} {:>15.6} {} : time {:.3} seconds",
        measurement.phase.name(),
        measurement.value,
        measurement.phase.unit(),
        measurement.seconds
    )
}

/// The `[SCORE ]` line.
pub fn score_line(result: &Io500Result) -> String {
    format!(
        "[SCORE ] Bandwidth {:.6} GiB/s : IOPS {:.6} kiops : TOTAL {:.6}{}",
        result.score.bandwidth,
        result.score.iops,
        result.score.total,
        if result.valid() { "" } else { " [INVALID]" }
    )
}

/// Everything IO500 prints for a run: the result lines, then the score.
pub fn text(result: &Io500Result) -> String {
    let mut text: String = result.measurements.iter().map(|measurement| result_line(measurement) + "\n").collect();
    text.push_str(&score_line(result));
    text.push('\n');
    text
}

fn json_string(text: &str) -> String {
    let escaped: String = text
        .chars()
        .map(|c| match c {
            '"' => "\\\"".to_string(),
            '\\' => "\\\\".to_string(),
            c if (c as u32) < 0x20 => format!("\\u{:04x}", c as u32),
            c => c.to_string(),
        })
        .collect();
    format!("\"{escaped}\"")
}

/// All results as one JSON document.
pub fn json(results: &[Io500Result]) -> String {
    let runs: Vec<String> = results
        .iter()
        .map(|result| {
            let phases: Vec<String> = result
                .measurements
                .iter()
                .map(|m| {
                    format!(
                        "{{\"phase\":\"{}\",\"value\":{:.6},\"unit\":\"{}\",\"seconds\":{:.6},\"items\":{},\"bytes\":{}}}",
                        m.phase.name(),
                        m.value,
                        m.phase.unit(),
                        m.seconds,
                        m.items,
                        m.bytes
                    )
                })
                .collect();
            format!(
                "{{\"target\":{},\"processes\":{},\"stonewall_seconds\":{},\"valid\":{},\"found\":{},\"phases\":[{}],\
                 \"score\":{{\"bandwidth_gib_s\":{:.6},\"iops_k\":{:.6},\"total\":{:.6}}}}}",
                json_string(&result.target),
                result.processes,
                result.stonewall.as_secs_f64(),
                result.valid(),
                result.found,
                phases.join(","),
                result.score.bandwidth,
                result.score.iops,
                result.score.total
            )
        })
        .collect();
    format!("{{\"io500\":[{}]}}\n", runs.join(","))
}

/// All results as CSV: one row per target and phase, then the scores.
pub fn csv(results: &[Io500Result]) -> String {
    let mut text = String::from("target,phase,value,unit,seconds,items,bytes\n");
    for result in results {
        let target = result.target.replace(',', ";");
        for m in &result.measurements {
            text.push_str(&format!(
                "{target},{},{:.6},{},{:.6},{},{}\n",
                m.phase.name(),
                m.value,
                m.phase.unit(),
                m.seconds,
                m.items,
                m.bytes
            ));
        }
        text.push_str(&format!("{target},score-bandwidth,{:.6},GiB/s,,,\n", result.score.bandwidth));
        text.push_str(&format!("{target},score-iops,{:.6},kIOPS,,,\n", result.score.iops));
        text.push_str(&format!("{target},score-total,{:.6},,,,\n", result.score.total));
    }
    text
}

/// One row per phase with the value on each target and the ratio of the first to the second.
pub fn comparison(first: &Io500Result, second: &Io500Result) -> String {
    let width = first.target.len().max(second.target.len()).max(12);
    let mut text = format!("{:<20} {:>width$} {:>width$} {:>8}\n", "phase", first.target, second.target, "ratio");
    let row = |name: &str, a: f64, b: f64, unit: &str| {
        format!("{name:<20} {:>width$} {:>width$} {:>8.2}\n", format!("{a:.3} {unit}"), format!("{b:.3} {unit}"), a / b.max(1e-12))
    };
    for phase in PHASES.iter().filter(|phase| phase.group().is_some()) {
        if let (Some(a), Some(b)) = (first.measurement(*phase), second.measurement(*phase)) {
            text.push_str(&row(phase.name(), a.value, b.value, phase.unit()));
        }
    }
    text.push_str(&row("score bandwidth", first.score.bandwidth, second.score.bandwidth, "GiB/s"));
    text.push_str(&row("score iops", first.score.iops, second.score.iops, "kIOPS"));
    text.push_str(&row("score total", first.score.total, second.score.total, ""));
    text
}

/// The scored phases in order (the timestamp has no result line).
pub fn scored_phases() -> impl Iterator<Item = Phase> {
    PHASES.into_iter().filter(|phase| phase.group().is_some())
}

#[cfg(test)]
mod tests {
    use super::super::{Io500Result, Score};
    use super::*;
    use std::time::Duration;

    fn result(target: &str, value: f64) -> Io500Result {
        let measurements: Vec<Measurement> =
            scored_phases().map(|phase| Measurement { phase, value, seconds: 1.5, items: 10, bytes: 20 }).collect();
        Io500Result {
            target: target.into(),
            processes: 2,
            stonewall: Duration::from_secs(1),
            score: Score::of(&measurements),
            measurements,
            found: 3,
        }
    }

    #[test]
    fn text_follows_io500s_format() {
        let text = text(&result("posix:/dev/shm", 2.0));
        assert!(text.starts_with("[RESULT]       ior-easy-write        2.000000 GiB/s : time 1.500 seconds\n"), "{text}");
        assert!(text.contains("[RESULT]                 find        2.000000 kIOPS"), "{text}");
        assert!(text.ends_with("[SCORE ] Bandwidth 2.000000 GiB/s : IOPS 2.000000 kiops : TOTAL 2.000000 [INVALID]\n"), "{text}");
        assert_eq!(text.lines().count(), 13);
    }

    #[test]
    fn json_csv_and_comparison_carry_every_phase() {
        let results = [result("ringfs", 1.0), result("posix:/x", 4.0)];
        let json = json(&results);
        assert_eq!(json.matches("\"phase\"").count(), 24);
        assert!(json.contains("\"total\":4.000000"));
        let csv = csv(&results);
        assert_eq!(csv.lines().count(), 1 + 2 * (12 + 3));
        let table = comparison(&results[0], &results[1]);
        assert!(table.contains("mdtest-hard-delete") && table.contains("0.25"), "{table}");
    }
}
