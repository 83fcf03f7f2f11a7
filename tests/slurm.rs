//! ringfs inside Slurm jobs, on a real Slurm cluster of 4 nodes on this machine
//! (`scripts/local-slurm.sh`: Debian's slurmctld and one slurmd per node, every node with its
//! own network namespace, host name and /tmp). Jobs are submitted with sbatch and run
//! `ringfs start`/`run`/`stop` as users would; the tests check what the jobs printed, what
//! reached the backend, and that nothing is left on any node afterwards.
//!
//! Needs root, network namespaces and the Slurm and munge packages (scripts/setup.sh installs
//! them). Where those are missing the tests are skipped with a message, unless
//! `RINGFS_REQUIRE_SLURM=1` (set by ./test.sh where they are there) makes that a failure.
//! The clusters of the tests run one after another (a lock), each torn down by `Drop`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{preload_library, ringfs_binary, workspace_root};

/// One local Slurm cluster at a time (they share the machine's two cores).
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

/// Seconds Slurm waits between SIGTERM and SIGKILL when it ends a job (`KillWait`).
const KILL_WAIT_S: u64 = 20;

struct LocalSlurm {
    dir: PathBuf,
    tag: String,
    nodes: usize,
    _one: MutexGuard<'static, ()>,
}

/// Why a local Slurm cluster cannot run here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    if !common::running_as_root() {
        return Some("not root".into());
    }
    for tool in ["ip", "unshare", "nsenter", "munged", "slurmctld", "slurmd", "sbatch"] {
        let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().is_ok_and(|output| output.status.success());
        if !found {
            return Some(format!("{tool} is missing (scripts/setup.sh installs slurmctld, slurmd, slurm-client and munge)"));
        }
    }
    None
}

impl LocalSlurm {
    /// Starts `nodes` nodes (`extra_conf`: lines added to slurm.conf); `None` (skipped) where
    /// that is impossible here.
    fn start(nodes: usize, extra_conf: &str) -> Option<LocalSlurm> {
        let one = ONE_CLUSTER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(reason) = missing_prerequisite() {
            assert!(
                std::env::var("RINGFS_REQUIRE_SLURM").as_deref() != Ok("1"),
                "a local Slurm cluster is required here (RINGFS_REQUIRE_SLURM=1) but: {reason}"
            );
            eprintln!("skipped: no local Slurm cluster here ({reason})");
            return None;
        }
        // The nodes see the host's files except /tmp, which is each node's own: a checkout
        // (or build directory) under /tmp is shared with them.
        let shared_tmp = shared_tmp_dirs().iter().map(|dir| dir.display().to_string()).collect::<Vec<_>>().join(":");
        let unique = (u64::from(std::process::id()) ^ ringfs_rpc::memory::random_u64()) % 100_000;
        let slurm =
            LocalSlurm { dir: PathBuf::from(format!("/var/tmp/ringfs-slurm-test-{unique}")), tag: format!("rs{unique}"), nodes, _one: one };
        let extra_conf = extra_conf.replace("{shared}", &slurm.shared().display().to_string());
        let output = slurm
            .script()
            .env("RINGFS_SLURM_EXTRA_CONF", extra_conf)
            .env("RINGFS_SLURM_SHARED_TMP", shared_tmp)
            .args(["start", &nodes.to_string()])
            .output()
            .unwrap();
        assert!(output.status.success(), "local-slurm.sh start failed:\n{}", String::from_utf8_lossy(&output.stderr));
        Some(slurm)
    }

    fn script(&self) -> Command {
        let mut command = Command::new(workspace_root().join("scripts/local-slurm.sh"));
        command
            .env("RINGFS_SLURM_DIR", &self.dir)
            .env("RINGFS_SLURM_TAG", &self.tag)
            .env("RINGFS_SLURM_KILL_WAIT", KILL_WAIT_S.to_string());
        command
    }

    /// Runs a command on the controller host (sbatch, scancel, scontrol).
    fn exec(&self, args: &[&str]) -> Output {
        self.script().arg("exec").args(args).output().unwrap()
    }

    /// A directory every node sees at the same path (standing for a shared file system).
    fn shared(&self) -> PathBuf {
        self.dir.join("shared")
    }

    /// Submits a batch job over all nodes running `body` (bash, with RINGFS, SHARED set);
    /// returns its id.
    fn submit(&self, name: &str, body: &str) -> String {
        self.submit_with(name, body, &[])
    }

    /// [`submit`] with more sbatch options.
    fn submit_with(&self, name: &str, body: &str, options: &[&str]) -> String {
        let script = self.shared().join(format!("{name}.sh"));
        let header = format!(
            "#!/bin/bash\nset -uo pipefail\nexport RINGFS={ringfs} SHARED={shared}\n",
            ringfs = ringfs_binary(),
            shared = self.shared().display()
        );
        std::fs::write(&script, format!("{header}{body}")).unwrap();
        self.sbatch(name, &script, options, &[])
    }

    /// Submits `script` over all nodes, one task per node (`options` and `environment`
    /// added); its output goes to `<name>.out` in the shared directory. Returns the job id.
    fn sbatch(&self, name: &str, script: &Path, options: &[&str], environment: &[(&str, String)]) -> String {
        let nodes = format!("--nodes={}", self.nodes);
        let output_path = self.output_path(name);
        let mut arguments = vec!["sbatch", "--parsable", &nodes, "--ntasks-per-node=1"];
        arguments.extend(options);
        arguments.extend(["--output", output_path.to_str().unwrap(), script.to_str().unwrap()]);
        let output =
            self.script().arg("exec").args(&arguments).envs(environment.iter().map(|(name, value)| (name, value))).output().unwrap();
        assert!(output.status.success(), "sbatch failed: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    fn output_path(&self, name: &str) -> PathBuf {
        self.shared().join(format!("{name}.out"))
    }

    fn job_output(&self, name: &str) -> String {
        std::fs::read_to_string(self.output_path(name)).unwrap_or_default()
    }

    /// The job's state (RUNNING, COMPLETED, CANCELLED, …).
    fn state(&self, job: &str) -> String {
        let output = self.exec(&["scontrol", "show", "job", "-o", job]);
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        text.split_whitespace().find_map(|field| field.strip_prefix("JobState=")).unwrap_or("UNKNOWN").to_string()
    }

    /// Waits until the job has ended; returns its final state.
    fn wait_for_end(&self, job: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let state = self.state(job);
            if !matches!(state.as_str(), "PENDING" | "CONFIGURING" | "RUNNING" | "COMPLETING") {
                return state;
            }
            assert!(Instant::now() < deadline, "job {job} still {state} after {timeout:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Node `node`'s /tmp (1-based, as the node names).
    fn node_tmp(&self, node: usize) -> PathBuf {
        self.dir.join(format!("nodes/node{node}/tmp"))
    }

    /// What is on node `node` that a ringfs cluster made: files under its /tmp (`allowed`:
    /// paths there that the job script made itself) and ringfs processes.
    fn leftovers(&self, node: usize, allowed: &[&str]) -> Vec<String> {
        let tmp = self.node_tmp(node);
        // (The mount points of the shared directories are empty directories there.)
        let shared = shared_tmp_dirs();
        let mut found: Vec<String> = walk(&tmp)
            .into_iter()
            .filter_map(|path| path.strip_prefix(&tmp).ok().map(|relative| relative.display().to_string()))
            .filter(|relative| !allowed.contains(&relative.as_str()) && !shared.contains(&Path::new("/tmp").join(relative)))
            .map(|relative| format!("node{node}: /tmp/{relative}"))
            .collect();
        let pids = Command::new("ip").args(["netns", "pids", &format!("{}-n{node}", self.tag)]).output().unwrap();
        for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
            let command_line = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let command_line = String::from_utf8_lossy(&command_line).replace('\0', " ");
            if command_line.contains("ringfs") {
                found.push(format!("node{node}: process {pid}: {command_line}"));
            }
        }
        found
    }

    /// Waits until no node has leftovers (see [`leftovers`]); returns how long that took, or
    /// panics with what is left after `timeout`.
    fn wait_until_clean(&self, allowed: &[&str], timeout: Duration) -> Duration {
        let start = Instant::now();
        loop {
            let left: Vec<String> = (1..=self.nodes).flat_map(|node| self.leftovers(node, allowed)).collect();
            if left.is_empty() {
                return start.elapsed();
            }
            assert!(start.elapsed() < timeout, "left behind after {timeout:?}:\n{}", left.join("\n"));
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Takes node `node`'s link to the switch down (or up again).
    fn set_link(&self, node: usize, up: bool) {
        let port = format!("{}-p{node}", self.tag);
        let status = Command::new("ip")
            .args(["-n", &format!("{}-sw", self.tag), "link", "set", &port, if up { "up" } else { "down" }])
            .status()
            .unwrap();
        assert!(status.success(), "ip link set {port}");
    }
}

impl Drop for LocalSlurm {
    fn drop(&mut self) {
        // A failed test shows what Slurm said before the cluster's directory goes.
        if std::thread::panicking() {
            let logs = std::iter::once(self.dir.join("ctl/slurmctld.log"))
                .chain((1..=self.nodes).map(|node| self.dir.join(format!("nodes/node{node}/slurmd.log"))));
            for log in logs {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!("--- last lines of {}:\n{}", log.display(), lines[lines.len().saturating_sub(25)..].join("\n"));
            }
        }
        match self.script().arg("stop").output() {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!("cleanup: local-slurm.sh stop: {}", String::from_utf8_lossy(&output.stderr)),
            Err(error) => eprintln!("cleanup: local-slurm.sh stop: {error}"),
        }
    }
}

/// The directories directly under /tmp that hold the binary under test or the workspace
/// (none when both are elsewhere): the nodes must see them.
fn shared_tmp_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = [PathBuf::from(ringfs_binary()), workspace_root()]
        .iter()
        .filter_map(|path| path.strip_prefix("/tmp").ok()?.components().next().map(|first| Path::new("/tmp").join(first)))
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Every path under `dir` (not `dir` itself).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .flat_map(|entry| {
            let path = entry.path();
            let mut below = if entry.file_type().is_ok_and(|kind| kind.is_dir()) { walk(&path) } else { Vec::new() };
            below.insert(0, path);
            below
        })
        .collect()
}

/// Waits for a file the job makes when it reaches a point.
fn wait_for_file(path: &Path, timeout: Duration, slurm: &LocalSlurm, job: &str) {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "job {job} did not reach {} (state {}):\n{}",
            path.display(),
            slurm.state(job),
            slurm.job_output(job)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Each node writes a file through the preload library (3 MiB and more, in odd-sized
/// writes: chunks on every server) and reads the next node's: every byte checked.
const READ_WRITE_PY: &str = r#"
import os, random, sys
mode, root = sys.argv[1], sys.argv[2]
nodes, me = int(os.environ["SLURM_NNODES"]), int(os.environ["SLURM_NODEID"])
def content(part):
    return random.Random(part).randbytes(3 * 1024 * 1024 + part * 1000 + 17)
if mode == "write":
    data = content(me)
    with open(f"{root}/part-{me}", "wb") as f:
        for start in range(0, len(data), 100_003):
            f.write(data[start:start + 100_003])
    print(f"{os.uname().nodename} wrote part-{me}", flush=True)
else:
    other = (me + 1) % nodes
    with open(f"{root}/part-{other}", "rb") as f:
        data = f.read()
    if data != content(other):
        sys.exit(f"{os.uname().nodename}: part-{other} differs ({len(data)} bytes)")
    print(f"{os.uname().nodename} verified part-{other} of another node ({len(data)} bytes)", flush=True)
"#;

/// A batch job over 4 nodes: `ringfs run --preload` starts a server on every node (removing
/// what a killed job left on two of them), the ranks write and read each other's files
/// through the preload library, an MPI-IO program runs across the nodes (srun with Slurm's
/// PMI), and after the job nothing of ringfs is left on any node.
#[test]
fn a_batch_job_across_four_nodes_shares_files_through_the_preload_library() {
    let Some(slurm) = LocalSlurm::start(4, "") else { return };
    preload_library();
    std::fs::write(slurm.shared().join("rw.py"), READ_WRITE_PY).unwrap();
    // What a killed job left on nodes 2 and 3 (its agent gone): the job's start removes it.
    for node in [2, 3] {
        let tmp = slurm.node_tmp(node);
        let node_dir = tmp.join(format!("ringfs-0/slurm-7-dead00/node{node}"));
        let store = tmp.join(format!("old-store/slurm-7-dead00/node{node}"));
        std::fs::create_dir_all(node_dir.join("tmp")).unwrap();
        std::fs::create_dir_all(&store).unwrap();
        std::fs::write(store.join("chunk"), "old data").unwrap();
        std::fs::write(node_dir.join("agent"), format!("agent 4000000\nstore /tmp/old-store/slurm-7-dead00/node{node}\n")).unwrap();
    }
    let mpi = common::mpi::Mpi::find();
    let mpi_step = match &mpi {
        Some(mpi) => {
            let program = slurm.shared().join("mpiio");
            let compiled = mpi.compile(&workspace_root().join("tests/c/mpiio.c"), &program);
            assert!(compiled.status.success(), "{}: {}", mpi.compiler, String::from_utf8_lossy(&compiled.stderr));
            format!("srun --mpi={} --nodes=4 --ntasks=4 {} /rfs/mpi", mpi.srun_plugin(), program.display())
        }
        None => {
            assert!(std::env::var_os("RINGFS_REQUIRE_MPI").is_none(), "an MPI is required (RINGFS_REQUIRE_MPI)");
            eprintln!("note: no MPI here; the MPI-IO step is left out");
            String::new()
        }
    };
    let job = slurm.submit(
        "preload",
        &format!(
            r#"$RINGFS run --preload /rfs -- bash -euc '
mkdir /rfs/data /rfs/mpi
srun python3 $SHARED/rw.py write /rfs/data
srun python3 $SHARED/rw.py read /rfs/data
echo "files: $(ls /rfs/data | wc -l)"
{mpi_step}
'
echo "ringfs run exited $?"
"#
        ),
    );
    let state = slurm.wait_for_end(&job, Duration::from_secs(240));
    let output = slurm.job_output("preload");
    assert_eq!(state, "COMPLETED", "{output}");
    assert!(output.contains("ringfs run exited 0"), "{output}");
    for node in 0..4 {
        let reader = format!("node{}", (node + 3) % 4 + 1);
        assert!(output.contains(&format!("node{} wrote part-{node}", node + 1)), "{output}");
        assert!(output.contains(&format!("{reader} verified part-{node} of another node")), "{output}");
    }
    assert!(output.contains("files: 4"), "{output}");
    if mpi.is_some() {
        assert!(output.contains(&format!("mpiio ok 4 {}", 4 * (1 << 20) + 4 * 64 * 1000)), "{output}");
    }
    // (old-store is the killed job's --store PATH: its own directory, not ringfs's.)
    slurm.wait_until_clean(&["old-store"], Duration::from_secs(5));
}

/// `scancel` in the middle of a job: Slurm signals the step of ringfs's node agents, each
/// stops its server and removes its run directory and store (`--store dir:` on the node's
/// /tmp), and the launching node's run directory goes when the step ends — well within
/// Slurm's KillWait.
#[test]
fn scancel_in_the_middle_of_a_job_cleans_every_node() {
    let Some(slurm) = LocalSlurm::start(4, "") else { return };
    let ready = slurm.shared().join("ready");
    let job = slurm.submit(
        "scancel",
        r#"eval "$($RINGFS start --store dir:/tmp/store)"
srun sh -c 'head -c 2500000 /dev/urandom | $RINGFS put /dev/stdin /from-$SLURM_NODEID'
touch $SHARED/ready
sleep 600
"#,
    );
    wait_for_file(&ready, Duration::from_secs(90), &slurm, &job);
    for node in 1..=4 {
        let stored = walk(&slurm.node_tmp(node).join("store")).into_iter().filter(|path| path.is_file()).count();
        assert!(stored > 0, "node{node} stores chunks in its /tmp/store before the cancel");
    }
    let cancelled = Instant::now();
    assert!(slurm.exec(&["scancel", &job]).status.success());
    let state = slurm.wait_for_end(&job, Duration::from_secs(KILL_WAIT_S + 30));
    assert_eq!(state, "CANCELLED", "{}", slurm.job_output("scancel"));
    // The store's parent (/tmp/store) is the job's own directory, not ringfs's.
    slurm.wait_until_clean(&["store"], Duration::from_secs(KILL_WAIT_S));
    eprintln!("every node clean {:?} after scancel", cancelled.elapsed());
}

/// A job that reaches its time limit inside `ringfs run`: Slurm sends SIGTERM to the batch
/// step and the servers' step, then SIGKILL after KillWait; ringfs run passes the signal to
/// its command and stops the cluster, the agents clean their nodes, and nothing is left.
#[test]
fn a_job_at_its_time_limit_cleans_every_node() {
    let Some(slurm) = LocalSlurm::start(4, "") else { return };
    let ready = slurm.shared().join("ready");
    let job = slurm.submit_with(
        "timelimit",
        r#"exec $RINGFS run --store dir:/tmp/store -- bash -c '
srun sh -c "head -c 2500000 /dev/urandom | $RINGFS put /dev/stdin /from-\$SLURM_NODEID"
touch $SHARED/ready
sleep 600
'
"#,
        &["--time=1"],
    );
    wait_for_file(&ready, Duration::from_secs(90), &slurm, &job);
    let state = slurm.wait_for_end(&job, Duration::from_secs(60 + 60 + KILL_WAIT_S));
    assert_eq!(state, "TIMEOUT", "{}", slurm.job_output("timelimit"));
    let took = slurm.wait_until_clean(&["store"], Duration::from_secs(KILL_WAIT_S));
    eprintln!("every node clean {took:?} after the job ended at its time limit");
}

/// A node cut off in the middle of a job (its link down): reads of files with chunks on it
/// fail with EIO within the client's timeout (RINGFS_TIMEOUT_MS, 3 s here), `ringfs stop`
/// fails and names the node; once the node is back, Slurm ends the job there and the epilog
/// (examples/slurm/epilog.sh) removes what the agent killed there and the failed stop left.
#[test]
fn a_node_cut_off_mid_job_gives_eio_in_bounded_time_and_the_stop_names_it() {
    let Some(slurm) = LocalSlurm::start(4, "Epilog={shared}/epilog") else { return };
    let epilog = slurm.shared().join("epilog");
    std::fs::write(
        &epilog,
        format!("#!/bin/sh\nRINGFS={} exec {}\n", ringfs_binary(), workspace_root().join("examples/slurm/epilog.sh").display()),
    )
    .unwrap();
    assert!(Command::new("chmod").arg("755").arg(&epilog).status().unwrap().success());
    let job = slurm.submit(
        "cut",
        &format!(
            r#"eval "$($RINGFS start)"
export RINGFS_TIMEOUT_MS=3000
for i in $(seq 8); do head -c 2500000 /dev/urandom | $RINGFS put /dev/stdin /f$i || exit 1; done
touch $SHARED/ready
while [ ! -e $SHARED/cut ]; do sleep 0.1; done
for i in $(seq 8); do
    start=$(date +%s%N)
    if LD_PRELOAD={preload} RINGFS_MOUNT=/rfs cat /rfs/f$i > /dev/null 2> $SHARED/error; then result=ok; else result=$(cat $SHARED/error); fi
    echo "read /rfs/f$i: $result in $(( ($(date +%s%N) - start) / 1000000 )) ms"
done
start=$(date +%s%N)
$RINGFS stop 2> $SHARED/stop-error
echo "stop exited $? in $(( ($(date +%s%N) - start) / 1000000 )) ms"
cat $SHARED/stop-error
echo "job done"
"#,
            preload = preload_library().display()
        ),
    );
    wait_for_file(&slurm.shared().join("ready"), Duration::from_secs(90), &slurm, &job);
    slurm.set_link(3, false);
    std::fs::write(slurm.shared().join("cut"), "").unwrap();
    // The job cannot end in Slurm's eyes while node3 is away: wait for its last line.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !slurm.job_output("cut").contains("job done") {
        assert!(Instant::now() < deadline, "the job did not finish:\n{}", slurm.job_output("cut"));
        std::thread::sleep(Duration::from_millis(200));
    }
    let output = slurm.job_output("cut");
    let reads: Vec<&str> = output.lines().filter(|line| line.starts_with("read /rfs/f")).collect();
    assert_eq!(reads.len(), 8, "{output}");
    let failed: Vec<&&str> = reads.iter().filter(|line| line.contains("Input/output error")).collect();
    assert!(!failed.is_empty(), "reads of chunks on the cut-off node fail:\n{output}");
    for line in &reads {
        let milliseconds: u64 = line.rsplit(" in ").next().and_then(|time| time.trim_end_matches(" ms").parse().ok()).unwrap();
        assert!(line.ends_with("ms") && milliseconds < 3000 + 2000, "a read took too long (deadline 3 s + 2 s slack): {line}");
        assert!(line.contains(": ok in") || line.contains("Input/output error"), "{line}");
    }
    assert!(output.contains("stop exited 1"), "{output}");
    assert!(output.contains("node node3 did not confirm"), "the stop names the lost node:\n{output}");
    assert!(!output.contains("node node2 did not confirm") && !output.contains("node node4 did not confirm"), "{output}");
    slurm.set_link(3, true);
    let state = slurm.wait_for_end(&job, Duration::from_secs(120));
    assert_eq!(state, "COMPLETED", "{output}");
    let took = slurm.wait_until_clean(&[], Duration::from_secs(KILL_WAIT_S + 60));
    eprintln!("every node clean {took:?} after the job ended");
}

/// Cache mode over a directory standing for the parallel file system: every node reads
/// the job's input from the backend through ringfs and writes its output; after the job
/// (`ringfs run` flushes at its stop) the outputs are in the backend directory, byte for
/// byte.
#[test]
fn a_cache_mode_jobs_outputs_reach_the_backend_after_the_job() {
    let Some(slurm) = LocalSlurm::start(4, "") else { return };
    preload_library();
    let backend = slurm.shared().join("pfs");
    std::fs::create_dir_all(&backend).unwrap();
    let mut input = vec![0u8; 2_500_000];
    common::Random::new(31).fill(&mut input);
    std::fs::write(backend.join("input.bin"), &input).unwrap();
    std::fs::write(slurm.shared().join("input.copy"), &input).unwrap();
    std::fs::write(
        slurm.shared().join("cache.py"),
        r#"
import os, sys
root, copy = sys.argv[1], sys.argv[2]
me = int(os.environ["SLURM_NODEID"])
with open(f"{root}/input.bin", "rb") as f:
    data = f.read()
with open(copy, "rb") as f:
    if f.read() != data:
        sys.exit(f"{os.uname().nodename}: the input read through ringfs differs from the backend's")
with open(f"{root}/out/part-{me}", "wb") as f:
    f.write(bytes(reversed(data[me * 1000 : me * 1000 + 1_500_000])))
print(f"{os.uname().nodename} read the input and wrote out/part-{me}", flush=True)
"#,
    )
    .unwrap();
    let job = slurm.submit(
        "cache",
        r#"$RINGFS run --backend $SHARED/pfs --mount-path /pfs --preload /rfs -- bash -euc '
mkdir /rfs/pfs/out
srun python3 $SHARED/cache.py /rfs/pfs $SHARED/input.copy
'
echo "ringfs run exited $?"
"#,
    );
    let state = slurm.wait_for_end(&job, Duration::from_secs(240));
    let output = slurm.job_output("cache");
    assert_eq!(state, "COMPLETED", "{output}");
    assert!(output.contains("ringfs run exited 0"), "{output}");
    for node in 0..4usize {
        let expected: Vec<u8> = input[node * 1000..node * 1000 + 1_500_000].iter().rev().copied().collect();
        let written = std::fs::read(backend.join(format!("out/part-{node}"))).unwrap_or_default();
        assert!(written == expected, "out/part-{node} in the backend: {} bytes, not the job's output\n{output}", written.len());
    }
    slurm.wait_until_clean(&[], Duration::from_secs(5));
}

/// Writes an executable wrapper `name` in the shared directory that runs the example script
/// `example` with `settings` (Slurm gives prologs and epilogs a fixed environment).
fn install_wrapper(slurm: &LocalSlurm, name: &str, example: &str, settings: &str) {
    let path = slurm.shared().join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{settings} exec {}\n", workspace_root().join("examples/slurm").join(example).display()))
        .unwrap();
    assert!(Command::new("chmod").arg("755").arg(&path).status().unwrap().success());
}

/// ringfs offered by the centre: with examples/slurm's prolog, task prolog and epilog
/// configured, a job that asks for it (`--constraint=ringfs`) finds a server on each of its
/// nodes and the client environment in every task, with no start or stop lines; after the
/// job the epilog has stopped the servers and nothing is left on any node.
#[test]
fn a_job_asking_for_ringfs_gets_it_from_the_prolog_and_the_epilog_cleans_up() {
    let conf = "Prolog={shared}/prolog\nTaskProlog={shared}/task-prolog\nEpilog={shared}/epilog\nPrologFlags=Alloc";
    let Some(slurm) = LocalSlurm::start(4, conf) else { return };
    let key = slurm.shared().join("site.key");
    std::fs::write(&key, format!("{:016x}{:016x}", ringfs_rpc::memory::random_u64(), ringfs_rpc::memory::random_u64())).unwrap();
    let settings = format!("RINGFS={} RINGFS_SITE_KEY={}", ringfs_binary(), key.display());
    install_wrapper(&slurm, "prolog", "prolog.sh", &settings);
    install_wrapper(&slurm, "task-prolog", "task-prolog.sh", "");
    install_wrapper(&slurm, "epilog", "epilog.sh", &settings);
    let job = slurm.submit_with(
        "offered",
        r#"echo "batch script sees: $RINGFS_SERVER"
srun sh -c 'echo "written on $(hostname)" | $RINGFS put /dev/stdin /from-$SLURM_NODEID'
srun sh -c 'echo "$(hostname) reads: $($RINGFS cat /from-$(( (SLURM_NODEID + 1) % 4 )))"'
echo "entries: $($RINGFS ls / | wc -l)"
"#,
        &["--constraint=ringfs"],
    );
    let state = slurm.wait_for_end(&job, Duration::from_secs(120));
    let output = slurm.job_output("offered");
    assert_eq!(state, "COMPLETED", "{output}");
    let port = 7717 + job.parse::<u16>().unwrap() % 1000;
    let servers: Vec<String> = (1..=4).map(|node| format!("node{node}:{port}")).collect();
    assert!(output.contains(&format!("batch script sees: {}", servers.join(","))), "{output}");
    for node in 1..=4 {
        assert!(output.contains(&format!("node{node} reads: written on node{}", node % 4 + 1)), "{output}");
    }
    assert!(output.contains("entries: 4"), "{output}");
    let took = slurm.wait_until_clean(&[], Duration::from_secs(KILL_WAIT_S + 30));
    eprintln!("every node clean {took:?} after the job ended");
}

/// The job scripts of examples/slurm run as they are: the plain job (stage in, the MPI-IO
/// program on ringfs across the nodes, stage out), the cache job (its outputs in the
/// backend after the job), and the checkpointing job twice — the second resumes from the
/// first's checkpoints, read back from the backend. Nothing is left on the nodes.
#[test]
fn the_example_job_scripts_run_on_the_cluster() {
    let Some(slurm) = LocalSlurm::start(4, "") else { return };
    preload_library();
    let shared = slurm.shared();
    let examples = workspace_root().join("examples/slurm");
    let ringfs = ("RINGFS", ringfs_binary().to_string());
    let run = |name: &str, script: &str, environment: &[(&str, String)]| -> String {
        let job = slurm.sbatch(name, &examples.join(script), &[], environment);
        let state = slurm.wait_for_end(&job, Duration::from_secs(240));
        let output = slurm.job_output(name);
        assert_eq!(state, "COMPLETED", "{script}:\n{output}");
        slurm.wait_until_clean(&[], Duration::from_secs(5));
        output
    };

    // The plain job, with the MPI-IO program as the application where there is an MPI.
    let input = shared.join("input");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::write(input.join("a.txt"), "first input\n").unwrap();
    std::fs::write(input.join("b.bin"), vec![7u8; 3 << 20]).unwrap();
    let mpi = common::mpi::Mpi::find();
    let app = match &mpi {
        Some(mpi) => {
            let program = shared.join("mpiio");
            assert!(mpi.compile(&workspace_root().join("tests/c/mpiio.c"), &program).status.success());
            format!("{} /ringfs/output", program.display())
        }
        None => "cp -r /ringfs/input/. /ringfs/output".to_string(),
    };
    let mpi_plugin = mpi.as_ref().map(|mpi| mpi.srun_plugin()).unwrap_or("none");
    let output_dir = shared.join("output");
    let environment = [
        ringfs.clone(),
        ("INPUT", input.display().to_string()),
        ("OUTPUT", output_dir.display().to_string()),
        ("APP", app),
        ("MPI", mpi_plugin.to_string()),
    ];
    let output = run("plain", "plain-job.sh", &environment);
    assert!(output.contains("plain job done: 2 outputs"), "{output}");
    if mpi.is_some() {
        assert!(output.contains("mpiio ok 4"), "{output}");
        assert_eq!(std::fs::metadata(output_dir.join("blocks")).unwrap().len(), 4 << 20, "staged out");
    }

    // The cache job: every task's checksum of the inputs lands in the backend.
    let pfs = shared.join("pfs");
    std::fs::create_dir_all(pfs.join("input")).unwrap();
    for (index, size) in [1_000_000usize, 2_500_000, 17].iter().enumerate() {
        let mut bytes = vec![0u8; *size];
        common::Random::new(index as u64).fill(&mut bytes);
        std::fs::write(pfs.join(format!("input/part-{index}")), bytes).unwrap();
    }
    let output = run("cache", "cache-job.sh", &[ringfs.clone(), ("PFS", pfs.display().to_string())]);
    assert!(output.contains("cache job done: 4 outputs"), "{output}");
    let local = Command::new("sh").arg("-c").arg("cat input/* | sha256sum").current_dir(&pfs).output().unwrap();
    let expected = String::from_utf8_lossy(&local.stdout).to_string();
    for task in 0..4 {
        let written = std::fs::read_to_string(pfs.join(format!("output/sum-{task}"))).unwrap_or_default();
        assert_eq!(written, expected, "output/sum-{task} in the backend");
    }

    // The checkpointing job: 200 steps, then a second job resumes and goes on to 300.
    let train = |steps: &str| {
        [
            ringfs.clone(),
            ("PFS", pfs.display().to_string()),
            ("TRAIN", examples.join("checkpoint.py").display().to_string()),
            ("STEPS", steps.to_string()),
        ]
    };
    let first = run("checkpoint-1", "checkpoint-job.sh", &train("200"));
    for rank in 0..4 {
        assert!(first.contains(&format!("rank {rank} done at step 200")), "{first}");
        assert!(pfs.join(format!("ckpt/step-000200/rank-{rank}.pkl")).exists(), "checkpoint in the backend:\n{first}");
    }
    let second = run("checkpoint-2", "checkpoint-job.sh", &train("300"));
    for rank in 0..4 {
        assert!(second.contains(&format!("rank {rank} resumed at step 200")), "{second}");
        assert!(second.contains(&format!("rank {rank} done at step 300")), "{second}");
    }
}
