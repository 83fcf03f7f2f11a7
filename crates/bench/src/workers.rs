//! Running a workload in N processes: a coordinator and its workers.
//!
//! The coordinator starts N worker processes (the same executable, with a worker
//! subcommand), and drives them phase by phase over their standard input and output: it
//! sends every worker the phase's command line at once (a barrier), and each worker answers
//! `ok <elapsed_ns> <ops> <bytes>` or `error <message>` when done. A phase's rate is the total
//! work divided by the slowest worker's time, as IOR and mdtest count it.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::BenchError;
use crate::target::TargetSpec;

/// What one worker reports for one phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerResult {
    pub elapsed: Duration,
    /// Operations done (files, requests, ...).
    pub ops: u64,
    pub bytes: u64,
}

/// A phase's result over all workers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhaseResult {
    /// Time of the slowest worker.
    pub elapsed: Duration,
    pub ops: u64,
    pub bytes: u64,
}

impl PhaseResult {
    pub fn combine(results: &[WorkerResult]) -> PhaseResult {
        PhaseResult {
            elapsed: results.iter().map(|result| result.elapsed).max().unwrap_or_default(),
            ops: results.iter().map(|result| result.ops).sum(),
            bytes: results.iter().map(|result| result.bytes).sum(),
        }
    }

    pub fn ops_per_second(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn bytes_per_second(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The workers of one workload: local processes driven through pipes, or processes started
/// by another launcher (mpirun) that connected over TCP.
pub struct Workers {
    children: Vec<Child>,
    inputs: Vec<Box<dyn Write + Send>>,
    outputs: Vec<BufReader<Box<dyn Read + Send>>>,
}

impl Workers {
    /// Starts `count` worker processes of `workload` on `target`: each runs
    /// `executable bench worker WORKLOAD --target SPEC --rank R --processes COUNT` with
    /// `environment` set (and, for a `preload:` target, the preload library).
    pub fn spawn(
        executable: &Path,
        workload: &str,
        target: &TargetSpec,
        count: usize,
        environment: &[(&str, String)],
    ) -> Result<Workers, BenchError> {
        let target_environment = target.worker_environment(executable).map_err(|error| BenchError::Worker(error.to_string()))?;
        let target = target.spec();
        let arguments = |rank: usize| {
            ["bench", "worker", workload, "--target", &target, "--rank", &rank.to_string(), "--processes", &count.to_string()]
                .map(String::from)
        };
        let mut workers = Workers { children: Vec::new(), inputs: Vec::new(), outputs: Vec::new() };
        for rank in 0..count {
            let mut child = Command::new(executable)
                .args(arguments(rank))
                .envs(environment.iter().chain(&target_environment).map(|(name, value)| (*name, value.as_str())))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|error| BenchError::Worker(format!("cannot start worker {rank}: {error}")))?;
            workers.inputs.push(Box::new(child.stdin.take().expect("piped stdin")));
            workers.outputs.push(BufReader::new(Box::new(child.stdout.take().expect("piped stdout"))));
            workers.children.push(child);
        }
        Ok(workers)
    }

    /// Accepts `count` workers connecting to `listener` (see [`serve_over_tcp`]); each first
    /// sends `rank R`, and they are ordered by rank.
    pub fn accept(listener: &TcpListener, count: usize, timeout: Duration) -> Result<Workers, BenchError> {
        let deadline = Instant::now() + timeout;
        listener.set_nonblocking(true).map_err(|error| BenchError::Worker(error.to_string()))?;
        let mut links: Vec<Option<(TcpStream, BufReader<TcpStream>)>> = (0..count).map(|_| None).collect();
        let mut connected = 0;
        while connected < count {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false).map_err(|error| BenchError::Worker(error.to_string()))?;
                    let mut reader = BufReader::new(stream.try_clone().map_err(|error| BenchError::Worker(error.to_string()))?);
                    let mut line = String::new();
                    reader.read_line(&mut line).map_err(|error| BenchError::Worker(error.to_string()))?;
                    let rank = line.trim().strip_prefix("rank ").and_then(|rank| rank.parse::<usize>().ok()).filter(|rank| *rank < count);
                    match rank {
                        Some(rank) if links[rank].is_none() => {
                            links[rank] = Some((stream, reader));
                            connected += 1;
                        }
                        _ => return Err(BenchError::Worker(format!("unexpected greeting {:?}", line.trim()))),
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(BenchError::Worker(format!("only {connected} of {count} workers connected")));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(error) => return Err(BenchError::Worker(error.to_string())),
            }
        }
        let mut workers = Workers { children: Vec::new(), inputs: Vec::new(), outputs: Vec::new() };
        for (stream, reader) in links.into_iter().flatten() {
            workers.inputs.push(Box::new(stream));
            let reader: BufReader<Box<dyn Read + Send>> = BufReader::new(Box::new(reader.into_inner()));
            workers.outputs.push(reader);
        }
        Ok(workers)
    }

    pub fn count(&self) -> usize {
        self.inputs.len()
    }

    /// Sends `command` to every worker and collects their answers (in rank order).
    pub fn run(&mut self, command: &str) -> Result<Vec<WorkerResult>, BenchError> {
        self.run_each(|_| command.to_string())
    }

    /// Like [`Workers::run`] with a different command line per rank. Every answer is read
    /// even when one is an error, so the workers stay in step for the next command.
    pub fn run_each(&mut self, command: impl Fn(usize) -> String) -> Result<Vec<WorkerResult>, BenchError> {
        for (rank, input) in self.inputs.iter_mut().enumerate() {
            writeln!(input, "{}", command(rank))
                .and_then(|()| input.flush())
                .map_err(|error| BenchError::Worker(format!("worker {rank} is gone: {error}")))?;
        }
        let mut results = Vec::with_capacity(self.outputs.len());
        let mut first_error = None;
        for (rank, output) in self.outputs.iter_mut().enumerate() {
            let mut line = String::new();
            let answer = output.read_line(&mut line).map_err(|error| error.to_string()).and_then(|_| parse_answer(&line));
            match answer {
                Ok(result) => results.push(result),
                Err(message) => {
                    first_error.get_or_insert(BenchError::Worker(format!("worker {rank}: {message}")));
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(results),
        }
    }

    /// Ends the workers and waits for them.
    pub fn finish(mut self) {
        self.inputs.clear();
        for child in &mut self.children {
            let _ = child.wait();
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.inputs.clear();
        for child in &mut self.children {
            if let Ok(None) = child.try_wait() {
                std::thread::sleep(Duration::from_millis(50));
                if let Ok(None) = child.try_wait() {
                    let _ = child.kill();
                }
            }
            let _ = child.wait();
        }
    }
}

fn parse_answer(line: &str) -> Result<WorkerResult, String> {
    let mut words = line.split_whitespace();
    match words.next() {
        Some("ok") => {
            let mut number = || words.next().and_then(|word| word.parse::<u64>().ok()).ok_or_else(|| format!("malformed answer {line:?}"));
            Ok(WorkerResult { elapsed: Duration::from_nanos(number()?), ops: number()?, bytes: number()? })
        }
        Some("error") => Err(line.trim_start_matches("error").trim().to_string()),
        _ if line.is_empty() => Err("exited without answering".into()),
        _ => Err(format!("malformed answer {line:?}")),
    }
}

/// The number at position `at` of a command line.
pub fn number(words: &[&str], at: usize) -> Result<u64, String> {
    words.get(at).and_then(|word| word.parse().ok()).ok_or_else(|| format!("missing number in {words:?}"))
}

/// The worker side: reads commands from standard input until it closes, runs each with
/// `handle`, and answers on standard output.
pub fn serve(handle: impl FnMut(&[&str]) -> Result<WorkerResult, String>) -> io::Result<()> {
    serve_on(io::stdin().lock(), io::stdout(), handle)
}

/// The worker side over TCP: connects to the coordinator at `address`, introduces itself as
/// `rank`, then serves commands like [`serve`].
pub fn serve_over_tcp(address: &str, rank: usize, handle: impl FnMut(&[&str]) -> Result<WorkerResult, String>) -> io::Result<()> {
    let mut stream = TcpStream::connect(address)?;
    writeln!(stream, "rank {rank}")?;
    let reader = BufReader::new(stream.try_clone()?);
    serve_on(reader, stream, handle)
}

fn serve_on(
    input: impl BufRead,
    mut output: impl Write,
    mut handle: impl FnMut(&[&str]) -> Result<WorkerResult, String>,
) -> io::Result<()> {
    for line in input.lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.is_empty() {
            continue;
        }
        match handle(&words) {
            Ok(result) => writeln!(output, "ok {} {} {}", result.elapsed.as_nanos(), result.ops, result.bytes)?,
            Err(message) => writeln!(output, "error {}", message.replace('\n', " "))?,
        }
        output.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse() {
        assert_eq!(parse_answer("ok 1000 5 6\n"), Ok(WorkerResult { elapsed: Duration::from_nanos(1000), ops: 5, bytes: 6 }));
        assert_eq!(parse_answer("error disk on fire\n"), Err("disk on fire".into()));
        assert!(parse_answer("").is_err());
        assert!(parse_answer("ok x").is_err());
    }

    #[test]
    fn the_slowest_worker_sets_the_time() {
        let combined = PhaseResult::combine(&[
            WorkerResult { elapsed: Duration::from_secs(1), ops: 10, bytes: 100 },
            WorkerResult { elapsed: Duration::from_secs(2), ops: 30, bytes: 300 },
        ]);
        assert_eq!(combined.elapsed, Duration::from_secs(2));
        assert_eq!(combined.ops_per_second(), 20.0);
        assert_eq!(combined.bytes_per_second(), 200.0);
    }
}
