//! `ringfs`: the one command of the ringfs file system.
//!
//! Subcommands start and stop a job's servers (`start`, `stop`, `status`, `server`), move
//! files in and out (`put`, `get`, `cat`) and manage names (`ls`, `stat`, `mkdir`, `rmdir`,
//! `rm`, `mv`, `ln`), and measure (`bench`). Clients find the cluster through the variables
//! `ringfs start` prints (`eval "$(ringfs start)"`). Errors are printed as one line and the
//! command exits with status 1.

mod bench_command;
mod cache_command;
mod cluster;
mod demo_command;
mod gmem_bench_command;
mod logger;
mod mount_command;
mod node_command;
mod run_command;
mod server_command;
mod signals;
mod tools;
mod ucx_bench_command;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use ringfs_client::Client;

#[derive(Parser, Debug)]
#[command(name = "ringfs", version, about = "A job-scoped parallel file system on node-local storage")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one server in the foreground (normally started by `ringfs start`).
    Server(server_command::ServerArgs),
    /// Start a cluster and print the environment clients need: eval "$(ringfs start)".
    Start {
        #[command(flatten)]
        start: cluster::StartArgs,
        /// Also mount the file system here (FUSE); `ringfs stop` unmounts it.
        #[arg(long)]
        mount: Option<PathBuf>,
    },
    /// Run a command on a fresh cluster: start, (mount), run, stop; exits with its status.
    Run(run_command::RunArgs),
    /// Mount the file system with FUSE (in the foreground, until SIGTERM or unmount).
    Mount(mount_command::MountArgs),
    /// Stop the cluster named by RINGFS_RUN_DIR (or --run-dir).
    Stop(cluster::StopArgs),
    /// One node's part of a cluster in a Slurm allocation (started by `ringfs start`
    /// through srun): runs the node's server, and cleans the node when it ends.
    #[command(hide = true)]
    NodeAgent(node_command::NodeAgentArgs),
    /// Runs the srun of a cluster in a Slurm allocation (started by `ringfs start`), and
    /// removes its run directory if the step ends without `ringfs stop`.
    #[command(hide = true)]
    SlurmStep(node_command::SlurmStepArgs),
    /// Remove what Slurm jobs' clusters left on this node (servers, run directories,
    /// stores); with --job, everything of that ended job (for an epilog).
    Cleanup(node_command::CleanupArgs),
    /// Show every server with its counters.
    Status(cluster::StatusArgs),
    /// Cache mode: write everything dirty now to the backend, then return.
    Sync,
    /// Cache mode: load backend files (and directories) into ringfs ahead of use; paths may
    /// be given as backend paths or as ringfs paths.
    Stagein {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Copy a local file into ringfs.
    Put { local: PathBuf, path: String },
    /// Copy a ringfs file to a local file (`-` for standard output).
    Get { path: String, local: PathBuf },
    /// Print a ringfs file.
    Cat { path: String },
    /// List a directory.
    Ls {
        #[arg(short, long)]
        long: bool,
        #[arg(default_value = "/")]
        path: String,
    },
    /// Show the attributes of a file.
    Stat { path: String },
    /// Create a directory.
    Mkdir {
        /// Create missing parents; no error if the directory exists.
        #[arg(short, long)]
        parents: bool,
        path: String,
    },
    /// Remove an empty directory.
    Rmdir { path: String },
    /// Remove a file (or a tree with -r).
    Rm {
        #[arg(short, long)]
        recursive: bool,
        path: String,
    },
    /// Rename a file.
    Mv { from: String, to: String },
    /// Start a local cluster, use it, measure it against /dev/shm, and stop it.
    Demo(demo_command::DemoArgs),
    /// Measure ringfs against a POSIX directory (micro benchmark).
    #[command(subcommand)]
    Bench(bench_command::BenchCommand),
    /// Create a symbolic link.
    Ln {
        /// (required) make a symbolic link.
        #[arg(short, long, required = true)]
        symbolic: bool,
        target: String,
        link: String,
    },
}

fn client() -> Result<Client> {
    Client::from_env().context("cannot connect to ringfs")
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Server(args) => server_command::run(args),
        Command::Start { start, mount } => {
            let started = ringfs_launch::start(&start.launch_config()?)?;
            if let Some(directory) = &mount {
                let executable = std::env::current_exe().context("cannot find the ringfs executable")?;
                if let Err(error) = started.mount(&executable, directory, &[]).map_err(anyhow::Error::from) {
                    let _ = started.stop();
                    return Err(error);
                }
                println!("export RINGFS_MOUNT={}", directory.display());
            }
            print!("{}", started.exports());
            eprintln!("ringfs: {} servers ready; run directory {}", started.servers.len(), started.run_dir.display());
            Ok(())
        }
        Command::Run(_) | Command::Mount(_) | Command::NodeAgent(_) | Command::SlurmStep(_) => unreachable!("handled in main"),
        Command::Cleanup(args) => node_command::cleanup(&args),
        Command::Stop(args) => cluster::stop(&args),
        Command::Status(args) => cluster::status_command(&args),
        Command::Sync => cache_command::sync(&client()?),
        Command::Stagein { paths } => cache_command::stagein(&client()?, &paths),
        Command::Put { local, path } => tools::put(&client()?, &local, &path).map(|_| ()),
        Command::Get { path, local } => tools::get(&client()?, &path, &local).map(|_| ()),
        Command::Cat { path } => tools::get(&client()?, &path, &PathBuf::from("-")).map(|_| ()),
        Command::Ls { long, path } => tools::ls(&client()?, &path, long),
        Command::Stat { path } => tools::stat(&client()?, &path),
        Command::Mkdir { parents, path } => tools::mkdir(&client()?, &path, parents),
        Command::Rmdir { path } => client()?.rmdir(&path).map_err(|errno| anyhow::anyhow!("{path}: {errno}")),
        Command::Rm { recursive, path } => tools::rm(&client()?, &path, recursive),
        Command::Mv { from, to } => client()?.rename(&from, &to).map_err(|errno| anyhow::anyhow!("{from} -> {to}: {errno}")),
        Command::Bench(command) => bench_command::run(command),
        Command::Demo(args) => demo_command::run(&args),
        Command::Ln { target, link, .. } => client()?.symlink(&target, &link).map_err(|errno| anyhow::anyhow!("{link}: {errno}")),
    }
}

/// Errors are printed as one line: the error and its causes, outermost first.
fn report(error: anyhow::Error) -> ExitCode {
    let broken_pipe =
        error.chain().any(|cause| cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe));
    if broken_pipe {
        // (`ringfs cat FILE | head`: the reader has what it wanted.)
        return ExitCode::from(BROKEN_PIPE_STATUS);
    }
    let causes: Vec<String> = error.chain().map(|cause| cause.to_string()).collect();
    eprintln!("ringfs: {}", causes.join(": "));
    ExitCode::FAILURE
}

/// The exit status of a tool whose output was closed before it finished, as of a Unix tool
/// killed by SIGPIPE (128 + 13).
const BROKEN_PIPE_STATUS: u8 = 141;

/// A tool whose standard output is closed early (`ringfs status | head -1`) stops quietly
/// with [`BROKEN_PIPE_STATUS`], as Unix tools do. Rust ignores SIGPIPE (a server or client
/// writing to a closed socket gets EPIPE, which it reports), so `println!` panics on a closed
/// pipe instead: that panic ends the process here without its message and backtrace.
fn quiet_on_closed_output() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info.payload_as_str().unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(i32::from(BROKEN_PIPE_STATUS));
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = if matches!(cli.command, Command::Server(_) | Command::Mount(_) | Command::NodeAgent(_)) {
        log::LevelFilter::Info
    } else {
        log::LevelFilter::Warn
    };
    logger::init(default_level);
    quiet_on_closed_output();
    let outcome = match cli.command {
        Command::Run(args) => run_command::run(args),
        Command::NodeAgent(args) => node_command::agent(args),
        Command::SlurmStep(args) => node_command::step(&args),
        Command::Mount(args) => mount_command::run(args).map(|()| ExitCode::SUCCESS),
        command => run(Cli { command }).map(|()| ExitCode::SUCCESS),
    };
    match outcome {
        Ok(code) => code,
        Err(error) => report(error),
    }
}
