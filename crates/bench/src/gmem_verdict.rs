//! What `ringfs bench gmem scan|stencil` concludes from its runs: which setting is fastest at
//! each rank count, by how much, and why — from the bytes the homes and the ranks moved and
//! from the conditions of the run (data out of core or not, emulated devices or not).

use std::fmt::Write;

use crate::gmem_apps::{AppRun, Setup, Workload};

/// The conditions a set of runs was made under.
#[derive(Clone, Copy, Debug)]
pub struct Conditions {
    pub workload: Workload,
    /// The data is larger than the servers' DRAM (it spills to their SSDs).
    pub out_of_core: bool,
    /// Servers and ranks run behind emulated SSDs and network links.
    pub emulated_devices: bool,
}

/// The verdict: a line per rank count with the settings fastest first, then why the winner
/// at the largest rank count wins.
pub fn verdict(runs: &[AppRun], conditions: &Conditions) -> String {
    let mut text = String::from("Which setting wins (seconds of the slowest rank, fastest first):\n");
    let mut rank_counts: Vec<u32> = runs.iter().map(|run| run.ranks).collect();
    rank_counts.dedup();
    for &ranks in &rank_counts {
        let ranked = ranked_runs(runs, ranks);
        let Some(best) = ranked.first() else { continue };
        let others: Vec<String> = ranked[1..]
            .iter()
            .map(|run| format!("{} {:.2} s ({:.2}x slower)", run.setup, run.seconds, run.seconds / best.seconds))
            .collect();
        let _ = writeln!(text, "  {ranks:>3} ranks: {} {:.2} s; {}", best.setup, best.seconds, others.join("; "));
    }
    if let Some(&largest) = rank_counts.iter().max() {
        let _ = writeln!(text, "Why, at {largest} ranks: {}", explanation(runs, largest, conditions));
    }
    text
}

/// The runs of `ranks` ranks other than the in-DRAM bound, fastest first.
fn ranked_runs(runs: &[AppRun], ranks: u32) -> Vec<&AppRun> {
    let mut ranked: Vec<&AppRun> = runs.iter().filter(|run| run.ranks == ranks && run.setup != Setup::InDram.name()).collect();
    ranked.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    ranked
}

fn mebibytes(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / f64::from(1 << 20))
}

fn explanation(runs: &[AppRun], ranks: u32, conditions: &Conditions) -> String {
    let ranked = ranked_runs(runs, ranks);
    let Some(best) = ranked.first() else { return "no run".into() };
    let find = |setup: Setup| runs.iter().find(|run| run.ranks == ranks && run.setup == setup.name());
    let bound = find(Setup::InDram)
        .map(|in_dram| format!(" With everything in the servers' DRAM (in-dram) it takes {:.2} s.", in_dram.seconds))
        .unwrap_or_default();
    let winner = Setup::parse(&best.setup);
    let mut why = match winner {
        Some(Setup::Cooperative | Setup::Relayed) => {
            let homes_serving = find(Setup::HomeServed)
                .map_or(String::new(), |run| format!(", against {} when only homes serve", mebibytes(run.bytes_from_homes)));
            let mechanism = match conditions.workload {
                Workload::Scan => {
                    "a block leaves its home's SSD and link once per wave of readers, and the ranks' links, together much wider \
                     than the homes', carry the other copies. Cooperation pays when many ranks read the same blocks and the \
                     homes' SSDs or links are the bottleneck."
                }
                Workload::Stencil => {
                    "the caches hold each rank's band, and a halo block a neighbour holds (written in the last sweep) comes from \
                     it instead of being written back to its home and read from there. Caches pay when a rank's data fits in its \
                     cache but not in the homes' DRAM; cooperation when ranks share blocks."
                }
            };
            format!(
                "with cooperation the homes sent {} and the ranks forwarded {} to each other{homes_serving}: {mechanism}",
                mebibytes(best.bytes_from_homes),
                mebibytes(best.bytes_from_peers),
            )
        }
        Some(Setup::HomeServed) => format!(
            "the caches keep the blocks a rank reads again (the homes sent {}, the SSDs read {} back), and with nothing for \
             ranks to share here, cooperation's directory steps cost without sparing a transfer.",
            mebibytes(best.bytes_from_homes),
            mebibytes(best.ssd_read_bytes),
        ),
        _ => {
            let mut causes = Vec::new();
            if !conditions.out_of_core {
                causes.push("the data fits in the servers' DRAM");
            }
            if !conditions.emulated_devices {
                causes.push("the links are this machine's loopback");
            }
            let causes = if causes.is_empty() { "the devices are fast for this data".to_string() } else { causes.join(" and ") };
            format!(
                "{causes}: no transfer is slow enough for a cache to spare, and a cache adds the directory's steps (a grant per \
                 block, forwards, invalidations) to every miss. Caches and cooperation pay out of core behind slow SSDs and links \
                 — this command's defaults."
            )
        }
    };
    if conditions.workload == Workload::Scan && matches!(winner, Some(Setup::Cooperative | Setup::Relayed)) {
        why.push_str(" (Without a cache every rank reads every block from its home.)");
    }
    why + &bound
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ranks: u32, setup: Setup, seconds: f64, from_homes: u64, from_peers: u64) -> AppRun {
        AppRun {
            ranks,
            setup: setup.name().into(),
            seconds,
            bytes_from_homes: from_homes << 20,
            bytes_from_peers: from_peers << 20,
            ..AppRun::default()
        }
    }

    #[test]
    fn the_fastest_setting_is_named_with_its_lead_and_the_reason() {
        let runs = [
            run(1, Setup::NoCache, 4.30, 32, 0),
            run(1, Setup::HomeServed, 4.32, 32, 0),
            run(1, Setup::Cooperative, 4.16, 32, 0),
            run(16, Setup::NoCache, 10.44, 512, 0),
            run(16, Setup::HomeServed, 7.61, 512, 0),
            run(16, Setup::Cooperative, 3.27, 32, 480),
        ];
        let text = verdict(&runs, &Conditions { workload: Workload::Scan, out_of_core: true, emulated_devices: true });
        assert!(text.contains("   16 ranks: cache+coop 3.27 s; cache 7.61 s (2.33x slower); no-cache 10.44 s (3.19x slower)"), "{text}");
        assert!(text.contains("    1 ranks: cache+coop 4.16 s; no-cache 4.30 s"), "{text}");
        assert!(text.contains("Why, at 16 ranks: with cooperation the homes sent 32 MiB and the ranks forwarded 480 MiB"), "{text}");
        assert!(text.contains("against 512 MiB when only homes serve"), "{text}");
    }

    #[test]
    fn caches_that_lose_in_dram_are_explained_by_the_conditions() {
        let runs =
            [run(16, Setup::NoCache, 0.10, 512, 0), run(16, Setup::HomeServed, 0.32, 512, 0), run(16, Setup::Cooperative, 0.54, 32, 480)];
        let text = verdict(&runs, &Conditions { workload: Workload::Scan, out_of_core: false, emulated_devices: false });
        assert!(text.contains("16 ranks: no-cache 0.10 s; cache 0.32 s (3.20x slower); cache+coop 0.54 s (5.40x slower)"), "{text}");
        assert!(text.contains("the data fits in the servers' DRAM and the links are this machine's loopback"), "{text}");
    }

    #[test]
    fn the_in_dram_run_is_the_bound_not_a_contender() {
        let runs = [run(4, Setup::NoCache, 3.5, 64, 0), run(4, Setup::Cooperative, 0.33, 8, 4), run(4, Setup::InDram, 0.16, 0, 0)];
        let text = verdict(&runs, &Conditions { workload: Workload::Stencil, out_of_core: true, emulated_devices: true });
        assert!(text.contains("4 ranks: cache+coop 0.33 s; no-cache 3.50 s (10.61x slower)"), "{text}");
        assert!(text.contains("With everything in the servers' DRAM (in-dram) it takes 0.16 s."), "{text}");
    }
}
