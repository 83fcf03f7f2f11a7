//! A minimal logger: `level  target: message` lines on stderr, filtered by `RINGFS_LOG`
//! (error, warn, info, debug, trace; default warn for tools, info for servers).

use ringfs_config::env;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

struct StderrLogger {
    level: log::LevelFilter,
}

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
            let line =
                format!("{}.{:03} {:5} {}: {}\n", now.as_secs(), now.subsec_millis(), record.level(), record.target(), record.args());
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }

    fn flush(&self) {}
}

/// Installs the logger; `RINGFS_LOG` overrides `default`.
pub fn init(default: log::LevelFilter) {
    let level = std::env::var(env::LOG).ok().and_then(|text| text.parse().ok()).unwrap_or(default);
    if log::set_boxed_logger(Box::new(StderrLogger { level })).is_ok() {
        log::set_max_level(level);
    }
}
