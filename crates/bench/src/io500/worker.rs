//! One IO500 process: runs the phase commands the coordinator sends.
//!
//! Commands (one line each; the answer is `ok <elapsed_ns> <ops> <bytes>`):
//!
//! | command | does |
//! |---|---|
//! | `setup DIR TRANSFER` | remember the data directory and ior-easy transfer size; rank 0 creates the phase directories and the ior-hard file |
//! | `setup-rank` | create this rank's mdtest-easy directory |
//! | `write-start KIND STONEWALL_MS LIMIT` | write until the stonewall (or LIMIT items); answer the count so far |
//! | `write-finish TARGET` | continue to TARGET items (wear-out), then fsync and close (ior) or sync (mdtest); elapsed counts from `write-start` |
//! | `read KIND COUNT`, `stat KIND COUNT`, `delete KIND COUNT` | work on the items of the next rank (IO500's `-C`/`-N 1`), verifying data read |
//! | `find NEWER_NS` | rank 0: IO500's find over the data directory; ops = entries scanned, bytes = matches |
//! | `cleanup` | rank 0: remove the data directory |
//!
//! KIND is `ior-easy`, `mdtest-easy`, `ior-hard` or `mdtest-hard`.

use std::time::{Duration, Instant};

use ringfs_client::FindFilter;

use super::pattern;
use crate::target::{Handle, Target};
use crate::workers::{WorkerResult, number};

/// IO500's ior-hard transfer (and block) size.
pub const IOR_HARD_TRANSFER: u64 = 47_008;
/// IO500's mdtest-hard file size.
pub const MDTEST_HARD_BYTES: u64 = 3_901;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    IorEasy,
    MdtestEasy,
    IorHard,
    MdtestHard,
}

impl Kind {
    fn parse(word: &str) -> Result<Kind, String> {
        match word {
            "ior-easy" => Ok(Kind::IorEasy),
            "mdtest-easy" => Ok(Kind::MdtestEasy),
            "ior-hard" => Ok(Kind::IorHard),
            "mdtest-hard" => Ok(Kind::MdtestHard),
            other => Err(format!("unknown phase kind {other:?}")),
        }
    }
}

/// A write phase between `write-start` and `write-finish`.
struct Writing {
    kind: Kind,
    started: Instant,
    count: u64,
    bytes: u64,
    handle: Option<Handle>,
}

/// State of one IO500 worker process.
pub struct Io500Worker {
    target: Target,
    rank: usize,
    processes: usize,
    data_dir: String,
    easy_transfer: u64,
    writing: Option<Writing>,
    buffer: Vec<u8>,
}

fn io(error: std::io::Error) -> String {
    error.to_string()
}

/// Pattern writer id of mdtest-hard file `index` of `rank` (distinct from ranks' ids).
fn mdtest_hard_writer(rank: usize, index: u64) -> u64 {
    (1 << 48) | ((rank as u64) << 32) | index
}

impl Io500Worker {
    pub fn new(target: Target, rank: usize, processes: usize) -> Io500Worker {
        Io500Worker { target, rank, processes, data_dir: String::new(), easy_transfer: 2 << 20, writing: None, buffer: Vec::new() }
    }

    fn neighbour(&self) -> usize {
        (self.rank + 1) % self.processes
    }

    fn ior_easy_file(&self, rank: usize) -> String {
        format!("{}/ior-easy/ior_file_easy.{rank:08}", self.data_dir)
    }

    fn ior_hard_file(&self) -> String {
        format!("{}/ior-hard/file", self.data_dir)
    }

    fn mdtest_easy_dir(&self, rank: usize) -> String {
        format!("{}/mdtest-easy/mdtest_tree.{rank}.0", self.data_dir)
    }

    fn mdtest_file(&self, kind: Kind, rank: usize, index: u64) -> String {
        match kind {
            Kind::MdtestEasy => format!("{}/file.mdtest.{rank}.{index}", self.mdtest_easy_dir(rank)),
            _ => format!("{}/mdtest-hard/file.mdtest.{rank}.{index}", self.data_dir),
        }
    }

    /// Runs one command.
    pub fn command(&mut self, words: &[&str]) -> Result<WorkerResult, String> {
        let started = Instant::now();
        let (ops, bytes) = match words.first().copied() {
            Some("setup") => {
                self.data_dir = words.get(1).ok_or("missing directory")?.to_string();
                self.easy_transfer = number(words, 2)?.max(1);
                if self.rank == 0 {
                    for dir in ["", "/ior-easy", "/ior-hard", "/mdtest-easy", "/mdtest-hard"] {
                        self.target.mkdir(&format!("{}{dir}", self.data_dir)).map_err(io)?;
                    }
                    self.target.create(&self.ior_hard_file()).and_then(Handle::close).map_err(io)?;
                }
                (0, 0)
            }
            Some("setup-rank") => {
                self.target.mkdir(&self.mdtest_easy_dir(self.rank)).map_err(io)?;
                (0, 0)
            }
            Some("write-start") => {
                let kind = Kind::parse(words.get(1).ok_or("missing kind")?)?;
                let stonewall = Duration::from_millis(number(words, 2)?);
                let limit = number(words, 3)?;
                self.write_start(kind, stonewall, limit)?
            }
            Some("write-finish") => return self.write_finish(number(words, 1)?),
            Some("read") => self.read(Kind::parse(words.get(1).ok_or("missing kind")?)?, number(words, 2)?)?,
            Some("stat") => self.stat(Kind::parse(words.get(1).ok_or("missing kind")?)?, number(words, 2)?)?,
            Some("delete") => self.delete(Kind::parse(words.get(1).ok_or("missing kind")?)?, number(words, 2)?)?,
            Some("find") => self.find(number(words, 1)? as i64)?,
            Some("cleanup") => {
                self.cleanup()?;
                (0, 0)
            }
            other => return Err(format!("unknown command {other:?}")),
        };
        Ok(WorkerResult { elapsed: started.elapsed(), ops, bytes })
    }

    fn write_start(&mut self, kind: Kind, stonewall: Duration, limit: u64) -> Result<(u64, u64), String> {
        let handle = match kind {
            Kind::IorEasy => Some(self.target.create(&self.ior_easy_file(self.rank)).map_err(io)?),
            Kind::IorHard => Some(self.target.open_write(&self.ior_hard_file()).map_err(io)?),
            Kind::MdtestEasy | Kind::MdtestHard => None,
        };
        self.writing = Some(Writing { kind, started: Instant::now(), count: 0, bytes: 0, handle });
        let started = Instant::now();
        loop {
            let count = self.writing.as_ref().map_or(0, |writing| writing.count);
            if count >= limit || started.elapsed() >= stonewall {
                break;
            }
            self.write_one()?;
        }
        let writing = self.writing.as_ref().expect("a write phase is running");
        Ok((writing.count, writing.bytes))
    }

    fn write_finish(&mut self, target: u64) -> Result<WorkerResult, String> {
        while self.writing.as_ref().is_some_and(|writing| writing.count < target) {
            self.write_one()?;
        }
        let writing = self.writing.take().ok_or("no write phase is running")?;
        match writing.handle {
            // ior: fsync at close (IOR's -e).
            Some(handle) => {
                handle.fsync().map_err(io)?;
                handle.close().map_err(io)?;
            }
            // mdtest: sync after the phase (mdtest's -Y).
            None => self.target.sync_all(),
        }
        Ok(WorkerResult { elapsed: writing.started.elapsed(), ops: writing.count, bytes: writing.bytes })
    }

    /// Writes the next item of the running write phase.
    fn write_one(&mut self) -> Result<(), String> {
        let writing = self.writing.as_mut().ok_or("no write phase is running")?;
        let index = writing.count;
        let written = match writing.kind {
            Kind::IorEasy => {
                let offset = index * self.easy_transfer;
                self.buffer.resize(self.easy_transfer as usize, 0);
                pattern::fill(&mut self.buffer, self.rank as u64, offset);
                writing.handle.as_ref().ok_or("no open file")?.write_at(&self.buffer, offset).map_err(io)?;
                self.easy_transfer
            }
            Kind::IorHard => {
                let offset = (index * self.processes as u64 + self.rank as u64) * IOR_HARD_TRANSFER;
                self.buffer.resize(IOR_HARD_TRANSFER as usize, 0);
                pattern::fill(&mut self.buffer, self.rank as u64, offset);
                writing.handle.as_ref().ok_or("no open file")?.write_at(&self.buffer, offset).map_err(io)?;
                IOR_HARD_TRANSFER
            }
            Kind::MdtestEasy => {
                let path = format!("{}/mdtest-easy/mdtest_tree.{}.0/file.mdtest.{}.{index}", self.data_dir, self.rank, self.rank);
                self.target.create_empty(&path).map_err(io)?;
                0
            }
            Kind::MdtestHard => {
                let path = format!("{}/mdtest-hard/file.mdtest.{}.{index}", self.data_dir, self.rank);
                self.buffer.resize(MDTEST_HARD_BYTES as usize, 0);
                pattern::fill(&mut self.buffer, mdtest_hard_writer(self.rank, index), 0);
                let handle = self.target.create(&path).map_err(io)?;
                handle.write_at(&self.buffer, 0).map_err(io)?;
                handle.close().map_err(io)?;
                MDTEST_HARD_BYTES
            }
        };
        writing.count += 1;
        writing.bytes += written;
        Ok(())
    }

    fn read(&mut self, kind: Kind, count: u64) -> Result<(u64, u64), String> {
        let writer = self.neighbour();
        match kind {
            Kind::IorEasy | Kind::IorHard => {
                let (path, transfer) = match kind {
                    Kind::IorEasy => (self.ior_easy_file(writer), self.easy_transfer),
                    _ => (self.ior_hard_file(), IOR_HARD_TRANSFER),
                };
                let handle = self.target.open_read(&path).map_err(io)?;
                self.buffer.resize(transfer as usize, 0);
                for index in 0..count {
                    let offset = match kind {
                        Kind::IorEasy => index * transfer,
                        _ => (index * self.processes as u64 + writer as u64) * transfer,
                    };
                    let got = handle.read_at(&mut self.buffer, offset).map_err(io)?;
                    if got != transfer as usize {
                        return Err(format!("{path}: short read of {got} bytes at offset {offset}"));
                    }
                    pattern::verify(&self.buffer, writer as u64, offset).map_err(|error| format!("{path}: {error}"))?;
                }
                handle.close().map_err(io)?;
                Ok((count, count * transfer))
            }
            Kind::MdtestHard => {
                // As mdtest: one read of the file's size (a larger buffer would cost POSIX
                // targets a second read that finds the end; the stat phase checks sizes).
                self.buffer.resize(MDTEST_HARD_BYTES as usize, 0);
                for index in 0..count {
                    let path = self.mdtest_file(kind, writer, index);
                    let handle = self.target.open_read(&path).map_err(io)?;
                    let got = handle.read_at(&mut self.buffer, 0).map_err(io)?;
                    handle.close().map_err(io)?;
                    if got != MDTEST_HARD_BYTES as usize {
                        return Err(format!("{path}: {got} bytes instead of {MDTEST_HARD_BYTES}"));
                    }
                    pattern::verify(&self.buffer[..got], mdtest_hard_writer(writer, index), 0)
                        .map_err(|error| format!("{path}: {error}"))?;
                }
                Ok((count, count * MDTEST_HARD_BYTES))
            }
            Kind::MdtestEasy => Err("mdtest-easy files are empty; there is no read phase".into()),
        }
    }

    fn stat(&self, kind: Kind, count: u64) -> Result<(u64, u64), String> {
        let writer = self.neighbour();
        let expected = if kind == Kind::MdtestHard { MDTEST_HARD_BYTES } else { 0 };
        for index in 0..count {
            let path = self.mdtest_file(kind, writer, index);
            let size = self.target.size(&path).map_err(|error| format!("{path}: {error}"))?;
            if size != expected {
                return Err(format!("{path}: size {size} instead of {expected}"));
            }
        }
        Ok((count, 0))
    }

    fn delete(&self, kind: Kind, count: u64) -> Result<(u64, u64), String> {
        let writer = self.neighbour();
        for index in 0..count {
            let path = self.mdtest_file(kind, writer, index);
            self.target.unlink(&path).map_err(|error| format!("{path}: {error}"))?;
        }
        Ok((count, 0))
    }

    fn find(&self, newer_than_ns: i64) -> Result<(u64, u64), String> {
        if self.rank != 0 {
            return Ok((0, 0));
        }
        let filter = FindFilter { newer_than_ns: Some(newer_than_ns), size: Some(MDTEST_HARD_BYTES), name: Some("*01*".into()) };
        let found = self.target.find(&self.data_dir, &filter).map_err(io)?;
        Ok((found.scanned, found.matched))
    }

    /// Removes the data directory (rank 0), also after a failed run.
    fn cleanup(&self) -> Result<(), String> {
        if self.rank != 0 || self.data_dir.is_empty() {
            return Ok(());
        }
        match self.target.remove_tree(&self.data_dir) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(format!("{}: {error}", self.data_dir)),
            _ => Ok(()),
        }
    }
}
