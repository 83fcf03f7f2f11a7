//! End-to-end tests of the benchmarks: `ringfs bench micro`, and `ringfs bench io500` and
//! `compare`, where tiny runs on ringfs and a POSIX directory complete with every phase
//! verified, damaged data fails the read phase, and the same binary runs as ranks of an
//! MPI-style launcher; and the demo, which runs both.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{TestCluster, ringfs_binary, scratch_dir};

/// Small limits so every write phase ends long before the stonewall (10 s: a phase ends at its
/// limit, so the stonewall only matters on a starved machine — with 1 s, three processes on a
/// loaded 2-vCPU CI machine once created 792 of their 900 files before it).
const TINY: &str = "[debug]\nstonewall-time = 10\n[ior-easy]\ntransferSize = 1m\nblockSize = 6m\n\
                    [ior-hard]\nsegmentCount = 120\n[mdtest-easy]\nn = 300\n[mdtest-hard]\nn = 250\n";

const PHASES: [&str; 12] = [
    "ior-easy-write",
    "mdtest-easy-write",
    "ior-hard-write",
    "mdtest-hard-write",
    "find",
    "ior-easy-read",
    "mdtest-easy-stat",
    "ior-hard-read",
    "mdtest-hard-stat",
    "mdtest-easy-delete",
    "mdtest-hard-read",
    "mdtest-hard-delete",
];

/// A scratch directory holding the tiny configuration, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = scratch_dir(tag);
        std::fs::write(dir.join("tiny.ini"), TINY).unwrap();
        std::fs::create_dir(dir.join("posix")).unwrap();
        Scratch(dir.keep())
    }

    fn config(&self) -> String {
        self.0.join("tiny.ini").display().to_string()
    }

    fn posix(&self) -> PathBuf {
        self.0.join("posix")
    }

    fn results(&self) -> PathBuf {
        self.0.join("results")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bench(args: &[&str], environment: &[(&str, String)]) -> Output {
    let mut command = Command::new(ringfs_binary());
    command.arg("bench").args(args).args(["--warm-memory", "0"]);
    for (name, value) in environment {
        command.env(name, value);
    }
    command.output().expect("run ringfs bench")
}

fn text(output: &Output) -> (String, String) {
    (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// One row of result.csv (the score rows have no items or bytes: 0 here).
struct Row {
    target: String,
    phase: String,
    value: f64,
    items: u64,
    bytes: u64,
}

fn read_csv(path: &Path) -> Vec<Row> {
    let csv = std::fs::read_to_string(path).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("target,phase,value,unit,seconds,items,bytes"));
    lines
        .map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            assert_eq!(fields.len(), 7, "{line}");
            Row {
                target: fields[0].to_string(),
                phase: fields[1].to_string(),
                value: fields[2].parse().unwrap(),
                items: fields[5].parse().unwrap_or(0),
                bytes: fields[6].parse().unwrap_or(0),
            }
        })
        .collect()
}

/// How many mdtest-hard files of a run match find's `-name "*01*"`.
fn expected_find_matches(processes: usize, files_per_process: u64) -> u64 {
    (0..processes)
        .map(|rank| (0..files_per_process).filter(|index| format!("file.mdtest.{rank}.{index}").contains("01")).count() as u64)
        .sum()
}

/// Checks the output and result files of one target's run of the tiny configuration.
fn check_run(stdout: &str, rows: &[Row], json: &serde_json::Value, target: &str, processes: usize) {
    let (scores, rows): (Vec<&Row>, Vec<&Row>) =
        rows.iter().filter(|row| row.target == target).partition(|row| row.phase.starts_with("score-"));
    assert_eq!(rows.iter().map(|row| row.phase.as_str()).collect::<Vec<_>>(), PHASES, "phases of {target}");
    assert_eq!(scores.iter().map(|row| row.phase.as_str()).collect::<Vec<_>>(), ["score-bandwidth", "score-iops", "score-total"]);
    assert!(scores.iter().all(|row| row.value > 0.0));
    for row in &rows {
        assert!(row.value > 0.0 && row.items > 0, "{target} {}: value {} items {}", row.phase, row.value, row.items);
        assert!(stdout.contains(&format!("[RESULT] {:>20}", row.phase)), "no [RESULT] line for {}", row.phase);
    }
    let row = |phase: &str| rows.iter().find(|row| row.phase == phase).unwrap();
    let procs = processes as u64;
    // The limits of the configuration, reached by every process.
    assert_eq!(row("ior-easy-write").items, 6 * procs);
    assert_eq!(row("ior-easy-write").bytes, (6 * procs) << 20);
    assert_eq!(row("ior-hard-write").items, 120 * procs);
    assert_eq!(row("ior-hard-write").bytes, 120 * procs * 47_008);
    assert_eq!(row("mdtest-easy-write").items, 300 * procs);
    assert_eq!(row("mdtest-hard-write").items, 250 * procs);
    assert_eq!(row("mdtest-hard-write").bytes, 250 * procs * 3_901);
    // Reads, stats and deletes cover everything written.
    assert_eq!(row("ior-easy-read").bytes, row("ior-easy-write").bytes);
    assert_eq!(row("ior-hard-read").bytes, row("ior-hard-write").bytes);
    assert_eq!(row("mdtest-hard-read").bytes, row("mdtest-hard-write").bytes);
    for phase in ["mdtest-easy-stat", "mdtest-easy-delete"] {
        assert_eq!(row(phase).items, 300 * procs, "{phase}");
    }
    for phase in ["mdtest-hard-stat", "mdtest-hard-delete"] {
        assert_eq!(row(phase).items, 250 * procs, "{phase}");
    }
    // find scans every entry of the tree: 4 phase directories, the mdtest-easy directories,
    // the ior files and all mdtest files.
    assert_eq!(row("find").items, 4 + procs + procs + 1 + 300 * procs + 250 * procs);

    let run = json["io500"].as_array().unwrap().iter().find(|run| run["target"] == target).expect("target in result.json");
    assert_eq!(run["processes"], processes);
    assert_eq!(run["valid"], false, "a 10 s stonewall is not a valid IO500 run");
    assert_eq!(run["phases"].as_array().unwrap().len(), 12);
    assert_eq!(run["found"].as_u64().unwrap(), expected_find_matches(processes, 250));
    assert!(run["score"]["total"].as_f64().unwrap() > 0.0);
}

fn check_result_files(results: &Path) -> (Vec<Row>, serde_json::Value) {
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(results.join("result.json")).unwrap()).unwrap();
    let png = std::fs::read(results.join("chart.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 1000, "chart.png is a PNG");
    assert!(std::fs::read_to_string(results.join("result.txt")).unwrap().contains("[SCORE ] Bandwidth"));
    (read_csv(&results.join("result.csv")), json)
}

#[test]
fn compare_runs_a_tiny_io500_on_ringfs_and_a_posix_directory() {
    let scratch = Scratch::new("io500-compare");
    let baseline = scratch.posix().display().to_string();
    let results = scratch.results().display().to_string();
    let output = bench(&["compare", "--config", &scratch.config(), "--baseline", &baseline, "--results", &results], &[]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");

    let (rows, json) = check_result_files(&scratch.results());
    check_run(&stdout, &rows, &json, "ringfs", 2);
    check_run(&stdout, &rows, &json, &format!("posix:{baseline}"), 2);
    assert_eq!(stdout.matches("[SCORE ] Bandwidth").count(), 2);
    for phase in PHASES {
        let line =
            stdout.lines().find(|line| line.starts_with(&format!("{phase} "))).unwrap_or_else(|| panic!("no ratio line for {phase}"));
        // Every phase ran on both: positive rates (the ratio column is rounded to two
        // decimals, so a slow tiny run on a busy machine may print 0.00 there).
        let words: Vec<&str> = line.split_whitespace().collect();
        let (ours, theirs): (f64, f64) = (words[1].parse().unwrap(), words[3].parse().unwrap());
        assert!(ours > 0.0 && theirs > 0.0, "{line}");
    }
    assert!(stdout.contains("score total"));
    assert_eq!(std::fs::read_dir(scratch.posix()).unwrap().count(), 0, "the run removes its data directory");
}

#[test]
fn io500_on_a_running_cluster_with_three_processes() {
    let cluster = TestCluster::start(3);
    let scratch = Scratch::new("io500-running");
    let results = scratch.results().display().to_string();
    let environment = [("RINGFS_SERVER", cluster.addresses().join(",")), ("RINGFS_SECRET", cluster.secret.clone())];
    let output = bench(&["io500", "--use-running", "--procs", "3", "--config", &scratch.config(), "--results", &results], &environment);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let (rows, json) = check_result_files(&scratch.results());
    check_run(&stdout, &rows, &json, "ringfs", 3);
    assert!(cluster.client().readdir("/").unwrap().is_empty(), "the run removes its data directory");
}

#[test]
fn io500_through_the_preload_library_runs_every_phase_on_ringfs() {
    common::preload_library();
    let cluster = TestCluster::start(2);
    let scratch = Scratch::new("io500-preload");
    let results = scratch.results().display().to_string();
    let prefix = format!("/ringfs-bench-{}", std::process::id());
    let environment = [("RINGFS_SERVER", cluster.addresses().join(",")), ("RINGFS_SECRET", cluster.secret.clone())];
    let target = format!("preload:{prefix}");
    let output =
        bench(&["io500", "--target", &target, "--use-running", "--config", &scratch.config(), "--results", &results], &environment);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let (rows, json) = check_result_files(&scratch.results());
    check_run(&stdout, &rows, &json, "ringfs-preload", 2);
    assert!(!Path::new(&prefix).exists(), "the workers' files went to ringfs, not to the local {prefix}");
    assert!(cluster.client().readdir("/").unwrap().is_empty(), "the run removes its data directory from ringfs");
}

/// Runs the tiny configuration with `before_reads` run between the writes and the reads;
/// the run must fail naming the damaged file.
fn assert_damage_is_detected(target: &str, before_reads: &str, environment: &[(&str, String)], damaged: &str) {
    let scratch = Scratch::new("io500-damage");
    let (config, results) = (scratch.config(), scratch.results().display().to_string());
    let mut args = vec!["io500", "--target", target, "--config", &config, "--results", &results, "--before-reads", before_reads];
    if !environment.is_empty() {
        args.push("--use-running");
    }
    let output = bench(&args, environment);
    let (stdout, stderr) = text(&output);
    assert!(!output.status.success(), "a damaged file must fail the run\nstdout:\n{stdout}");
    assert!(stderr.contains("data mismatch") && stderr.contains(damaged), "stderr: {stderr}");
}

#[test]
fn a_damaged_ior_file_fails_the_read_phase_on_posix() {
    let scratch = Scratch::new("io500-posix-damage");
    let target = format!("posix:{}", scratch.posix().display());
    // One byte in the middle of rank 0's ior-easy file (rank 1 reads it).
    let damage = "printf X | dd of=\"$IO500_DATA_DIR/ior-easy/ior_file_easy.00000000\" bs=1 seek=3000000 conv=notrunc status=none";
    assert_damage_is_detected(&target, damage, &[], "ior_file_easy.00000000");
    assert_eq!(std::fs::read_dir(scratch.posix()).unwrap().count(), 0, "a failed run removes its data directory too");
}

#[test]
fn a_damaged_mdtest_file_fails_the_read_phase_on_ringfs() {
    let cluster = TestCluster::start(2);
    let environment = [("RINGFS_SERVER", cluster.addresses().join(",")), ("RINGFS_SECRET", cluster.secret.clone())];
    let scratch = scratch_dir("io500-copy");
    let copy = scratch.join("copy");
    // Rewrite one mdtest-hard file through ringfs with one byte changed.
    let damage = format!(
        "f=\"$IO500_DATA_DIR/mdtest-hard/file.mdtest.0.7\" && {ringfs} get \"$f\" {copy} && printf Y | dd of={copy} bs=1 seek=100 conv=notrunc status=none && {ringfs} put {copy} \"$f\"",
        ringfs = ringfs_binary(),
        copy = copy.display()
    );
    assert_damage_is_detected("ringfs", &damage, &environment, "file.mdtest.0.7");
    assert!(cluster.client().readdir("/").unwrap().is_empty(), "a failed run removes its data directory too");
}

#[test]
fn ranks_started_by_an_mpi_style_launcher_run_io500_together() {
    let cluster = TestCluster::start(2);
    let scratch = Scratch::new("io500-ranks");
    let rendezvous = scratch.0.join("rendezvous");
    let config = scratch.config();
    let results = scratch.results().display().to_string();
    // What `mpirun -np 3 ringfs bench io500 --rendezvous FILE` does: the same command in
    // every rank, told its rank by the launcher's variables.
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            Command::new(ringfs_binary())
                .args(["bench", "io500", "--warm-memory", "0", "--config", &config, "--results", &results])
                .arg("--rendezvous")
                .arg(&rendezvous)
                .env("RINGFS_SERVER", cluster.addresses().join(","))
                .env("RINGFS_SECRET", &cluster.secret)
                .env("PMI_RANK", rank.to_string())
                .env("PMI_SIZE", "3")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let outputs: Vec<Output> = ranks.into_iter().map(|rank| rank.wait_with_output().unwrap()).collect();
    for (rank, output) in outputs.iter().enumerate() {
        let (stdout, stderr) = text(output);
        assert!(output.status.success(), "rank {rank}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
    let (stdout, _) = text(&outputs[0]);
    let (rows, json) = check_result_files(&scratch.results());
    check_run(&stdout, &rows, &json, "ringfs", 3);
    assert!(!rendezvous.exists(), "rank 0 removes the rendezvous file");
    assert!(cluster.client().readdir("/").unwrap().is_empty());
}

#[test]
fn the_demo_uses_a_cluster_and_prints_both_io500_scores() {
    let output = Command::new(ringfs_binary()).arg("demo").output().expect("run ringfs demo");
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("checksum") && stdout.contains("matches"), "{stdout}");
    let scores = stdout.lines().find(|line| line.starts_with("IO500 score: ringfs ")).expect("a score line");
    let numbers: Vec<f64> = scores.split([' ', ',']).filter_map(|word| word.parse().ok()).collect();
    assert!(numbers.len() == 2 && numbers.iter().all(|score| *score > 0.0), "{scores}");
    assert!(stdout.contains("servers stopped"), "{stdout}");
}

#[test]
fn micro_measures_ringfs_and_the_baseline_and_writes_json() {
    let scratch = Scratch::new("micro");
    let json_path = scratch.0.join("micro.json");
    let baseline = scratch.posix().display().to_string();
    let output = Command::new(ringfs_binary())
        .args(["bench", "micro", "--size", "8M", "--files", "300", "--repeats", "2", "--baseline", &baseline, "--json"])
        .arg(&json_path)
        .output()
        .expect("run ringfs bench micro");
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!((json["processes"].as_u64(), json["repeats"].as_u64()), (Some(2), Some(2)));
    let targets = json["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 2, "ringfs and the baseline");
    for target in targets {
        for phase in ["write", "read", "create", "stat", "remove"] {
            let measured = &target["phases"][phase];
            assert!(measured["median"].as_f64().unwrap() > 0.0, "{target}");
            assert_eq!(measured["runs"].as_array().unwrap().len(), 2, "{target}");
        }
    }
    assert!(stdout.contains("ringfs/base") && stdout.lines().any(|line| line.starts_with("create ")), "{stdout}");
    assert_eq!(std::fs::read_dir(scratch.posix()).unwrap().count(), 0, "the benchmark removes its files");
}

/// `ringfs bench ucx` at a smoke size: ucx_perftest and the UCX frame transport both report
/// (skipped where UCX is not installed, required by test.sh where it is).
#[test]
fn ucx_bench_reports_the_frame_transport_beside_ucx_perftest() {
    let installed = Command::new("ucx_perftest").arg("-h").output().is_ok() && Path::new("/usr/include/ucp/api/ucp.h").exists();
    if !installed {
        assert!(std::env::var("RINGFS_REQUIRE_UCX").as_deref() != Ok("1"), "UCX is missing but RINGFS_REQUIRE_UCX=1");
        eprintln!("SKIPPED: UCX (libucx-dev, ucx-utils) is not installed");
        return;
    }
    let output = Command::new(ringfs_binary())
        .args(["bench", "ucx", "--rounds", "1", "--latency-iterations", "200", "--bandwidth-iterations", "20", "--variant", "tcp=tcp"])
        .output()
        .expect("run ringfs bench ucx");
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let row = stdout.lines().find(|line| line.starts_with("| tcp (`tcp`)")).unwrap_or_else(|| panic!("no tcp row:\n{stdout}"));
    let numbers: Vec<f64> = row.split('|').filter_map(|cell| cell.split_whitespace().next()?.trim_end_matches('×').parse().ok()).collect();
    assert!(numbers.len() >= 9 && numbers.iter().all(|number| number.is_finite()), "{row}");
    assert!(numbers[0] > 0.0 && numbers[2] > 0.0 && numbers[5] > 0.0 && numbers[7] > 0.0, "latencies and bandwidths measured: {row}");
}
