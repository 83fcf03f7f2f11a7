//! Parameters of an IO500 run, with IO500's defaults, optionally read from an IO500-style
//! INI file (`--config FILE`).

use std::time::Duration;

use crate::BenchError;

/// What an IO500 run does.
#[derive(Clone, Debug, PartialEq)]
pub struct Io500Config {
    pub processes: usize,
    /// How long each write phase runs before wearing out (IO500: 300 s).
    pub stonewall: Duration,
    /// `[ior-easy] transferSize` (IO500: 2 MiB).
    pub ior_easy_transfer: u64,
    /// `[ior-easy] blockSize`: the most bytes one process writes (IO500: 9920000 MiB).
    pub ior_easy_block: u64,
    /// `[ior-hard] segmentCount`: the most 47,008-byte segments per process (IO500: 10,000,000).
    pub ior_hard_max_segments: u64,
    /// `[mdtest-easy] n`: the most files per process (IO500: 1,000,000).
    pub mdtest_easy_max_files: u64,
    /// `[mdtest-hard] n`: the most files per process (IO500: 1,000,000).
    pub mdtest_hard_max_files: u64,
    /// A shell command run after the write phases and find, before the first read (to drop
    /// caches, restart servers, or damage a file on purpose in tests).
    pub before_reads: Option<String>,
}

impl Default for Io500Config {
    fn default() -> Self {
        Io500Config {
            processes: 2,
            stonewall: super::OFFICIAL_STONEWALL,
            ior_easy_transfer: 2 << 20,
            ior_easy_block: 9_920_000 << 20,
            ior_hard_max_segments: 10_000_000,
            mdtest_easy_max_files: 1_000_000,
            mdtest_hard_max_files: 1_000_000,
            before_reads: None,
        }
    }
}

/// Parses IOR-style sizes (`2m`, `9920000m`, `47008`, `4g`, `1k`: [`ringfs_config::ByteSize`]).
fn parse_size(text: &str) -> Option<u64> {
    text.parse::<ringfs_config::ByteSize>().ok().map(|size| size.bytes())
}

impl Io500Config {
    /// The most ior-easy transfers one process makes.
    pub fn ior_easy_max_transfers(&self) -> u64 {
        (self.ior_easy_block / self.ior_easy_transfer.max(1)).max(1)
    }

    /// Applies the settings of an IO500 INI file. Keys ringfs does not use (`api`,
    /// `datadir`, …) are returned, so the caller can say they were ignored.
    pub fn apply_ini(&mut self, text: &str) -> Result<Vec<String>, BenchError> {
        let mut section = String::new();
        let mut ignored = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.split(['#', ';']).next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')) {
                section = name.trim().to_string();
                continue;
            }
            let (key, value) =
                line.split_once('=').ok_or_else(|| BenchError::Setup(format!("line {}: expected key = value", number + 1)))?;
            let (key, value) = (key.trim(), value.trim());
            let invalid = || BenchError::Setup(format!("line {}: invalid value {value:?} for {key}", number + 1));
            match (section.as_str(), key) {
                ("debug", "stonewall-time") => self.stonewall = Duration::from_secs(value.parse().map_err(|_| invalid())?),
                ("ior-easy", "transferSize") => self.ior_easy_transfer = parse_size(value).filter(|size| *size > 0).ok_or_else(invalid)?,
                ("ior-easy", "blockSize") => self.ior_easy_block = parse_size(value).ok_or_else(invalid)?,
                ("ior-hard", "segmentCount") => self.ior_hard_max_segments = value.parse().map_err(|_| invalid())?,
                ("mdtest-easy", "n") => self.mdtest_easy_max_files = value.parse().map_err(|_| invalid())?,
                ("mdtest-hard", "n") => self.mdtest_hard_max_files = value.parse().map_err(|_| invalid())?,
                _ => ignored.push(format!("[{section}] {key}")),
            }
        }
        Ok(ignored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io500_ini_files_set_the_parameters() {
        let mut config = Io500Config::default();
        let ignored = config
            .apply_ini(
                "[global]\ndatadir = ./datafiles\n\n[debug]\nstonewall-time = 5 # short\n[ior-easy]\ntransferSize = 1m\nblockSize = 64m\n\
                 [ior-hard]\nsegmentCount = 500\n[mdtest-easy]\nn = 1000\n[mdtest-hard]\nn = 2000\nAPI = POSIX\n",
            )
            .unwrap();
        assert_eq!(config.stonewall, Duration::from_secs(5));
        assert_eq!((config.ior_easy_transfer, config.ior_easy_block, config.ior_easy_max_transfers()), (1 << 20, 64 << 20, 64));
        assert_eq!((config.ior_hard_max_segments, config.mdtest_easy_max_files, config.mdtest_hard_max_files), (500, 1000, 2000));
        assert_eq!(ignored, ["[global] datadir", "[mdtest-hard] API"]);
        assert!(config.apply_ini("[ior-easy]\ntransferSize = lots\n").is_err());
        assert!(config.apply_ini("no equals sign\n").is_err());
        assert_eq!(parse_size("9920000m"), Some(9_920_000 << 20));
        assert_eq!(Io500Config::default().ior_easy_max_transfers(), 4_960_000);
    }
}
