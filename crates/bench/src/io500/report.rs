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

/// All results as one JSON document.
pub fn json(results: &[Io500Result]) -> String {
    let runs: Vec<serde_json::Value> = results
        .iter()
        .map(|result| {
            let phases: Vec<serde_json::Value> = result
                .measurements
                .iter()
                .map(|m| {
                    serde_json::json!({
                        "phase": m.phase.name(), "value": m.value, "unit": m.phase.unit(),
                        "seconds": m.seconds, "items": m.items, "bytes": m.bytes,
                    })
                })
                .collect();
            serde_json::json!({
                "target": result.target,
                "processes": result.processes,
                "stonewall_seconds": result.stonewall.as_secs_f64(),
                "valid": result.valid(),
                "found": result.found,
                "phases": phases,
                "score": { "bandwidth_gib_s": result.score.bandwidth, "iops_k": result.score.iops, "total": result.score.total },
            })
        })
        .collect();
    serde_json::json!({ "io500": runs }).to_string() + "\n"
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
        let json: serde_json::Value = serde_json::from_str(&json(&results)).unwrap();
        let runs = json["io500"].as_array().unwrap();
        assert_eq!(runs.iter().map(|run| run["phases"].as_array().unwrap().len()).sum::<usize>(), 24);
        assert_eq!((runs[1]["target"].as_str(), runs[1]["score"]["total"].as_f64()), (Some("posix:/x"), Some(4.0)));
        let csv = csv(&results);
        assert_eq!(csv.lines().count(), 1 + 2 * (12 + 3));
        let table = comparison(&results[0], &results[1]);
        assert!(table.contains("mdtest-hard-delete") && table.contains("0.25"), "{table}");
    }
}
