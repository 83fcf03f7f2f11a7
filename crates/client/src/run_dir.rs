//! The run directory of a cluster, as clients read it.
//!
//! `ringfs start` keeps a cluster's state in a run directory: the secret, and for every server
//! `<name>.addr` (its current TCP address) and `<name>.pid` (host and process id), which the
//! server rewrites each time it starts — also when it is restarted by hand on a new port. The
//! run directory is therefore the source of truth for where the servers are: clients with
//! `RINGFS_RUN_DIR` set look there when the addresses they were given stop answering.
//!
//! Servers look at it too, every heartbeat, for servers their member list lacks or believes
//! dead ([`RunDirWatch`]). A cluster started from a hostfile keeps its run directory in
//! `$HOME`, usually on a shared file system: a watch lists the directory again only when it
//! changed, and reads only the address files of the servers asked about, so that an idle
//! cluster of N servers costs the file system N `stat`s a heartbeat, not N² opens.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use ringfs_sync::Mutex;

/// One server's entry in a run directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunDirServer {
    pub name: String,
    /// Current TCP address (`host:port`).
    pub address: String,
}

/// Reads the current address of every server recorded in `dir`, in name order. Servers named
/// in the launcher's `servers` list whose `<name>.addr` is missing keep the address the
/// launcher recorded.
pub fn servers(dir: &Path) -> Vec<RunDirServer> {
    recorded(dir).into_iter().filter_map(|(name, record)| Some(RunDirServer { address: record.address(dir, &name)?, name })).collect()
}

/// How a run directory records one server.
#[derive(Clone, Debug, Default)]
struct Record {
    /// It has an address file (`<name>.addr`).
    file: bool,
    /// The address the launcher's list gives it.
    listed: Option<String>,
}

impl Record {
    /// Its current address: the address file's, or else the launcher's.
    fn address(&self, dir: &Path, name: &str) -> Option<String> {
        self.file.then(|| read_address(dir, name)).flatten().or_else(|| self.listed.clone())
    }
}

/// The servers recorded in `dir`, by name (no address file read).
fn recorded(dir: &Path) -> BTreeMap<String, Record> {
    let mut records: BTreeMap<String, Record> = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if let Some(name) = entry.file_name().to_str().and_then(|name| name.strip_suffix(".addr")) {
                records.entry(name.to_string()).or_default().file = true;
            }
        }
    }
    if let Ok(listed) = std::fs::read_to_string(dir.join("servers")) {
        for line in listed.lines() {
            let mut words = line.split_whitespace();
            let (Some(name), Some(address)) = (words.next(), words.next()) else { continue };
            records.entry(name.to_string()).or_default().listed = Some(address.to_string());
        }
    }
    records
}

/// The address in `<name>.addr`, if it holds one.
fn read_address(dir: &Path, name: &str) -> Option<String> {
    let address = std::fs::read_to_string(dir.join(format!("{name}.addr"))).ok()?;
    let address = address.trim();
    (!address.is_empty()).then(|| address.to_string())
}

/// A directory modified this recently is listed again at every look: on a file system whose
/// timestamps are coarse, a change just after the last listing may not have moved the time.
const RECENT_CHANGE: Duration = Duration::from_secs(2);

/// A run directory a server looks at again and again (see the module's documentation).
pub struct RunDirWatch {
    dir: PathBuf,
    seen: Mutex<Seen>,
}

/// What a watch knows of its directory.
#[derive(Default)]
struct Seen {
    /// The directory's modification time when it was last listed.
    listed_at: Option<SystemTime>,
    /// The servers recorded then, with their addresses once read.
    servers: BTreeMap<String, (Record, Option<String>)>,
}

impl RunDirWatch {
    pub fn new(dir: &Path) -> RunDirWatch {
        RunDirWatch { dir: dir.to_path_buf(), seen: Mutex::new(Seen::default()) }
    }

    /// The recorded address of every server whose name `wanted` accepts, in name order.
    /// Lists the directory only if it changed since the last look, and reads a wanted
    /// server's address file once per change.
    pub fn servers(&self, wanted: impl Fn(&str) -> bool) -> Vec<RunDirServer> {
        let mut seen = self.seen.lock();
        let modified = std::fs::metadata(&self.dir).and_then(|metadata| metadata.modified()).ok();
        let recent = modified.is_none_or(|modified| modified.elapsed().is_ok_and(|age| age < RECENT_CHANGE));
        if recent || modified != seen.listed_at {
            seen.listed_at = modified;
            seen.servers = recorded(&self.dir).into_iter().map(|(name, record)| (name, (record, None))).collect();
        }
        let mut found = Vec::new();
        for (name, (record, address)) in seen.servers.iter_mut().filter(|(name, _)| wanted(name)) {
            if address.is_none() {
                *address = record.address(&self.dir, name);
            }
            if let Some(address) = address {
                found.push(RunDirServer { name: name.clone(), address: address.clone() });
            }
        }
        found
    }
}

/// The current addresses of the servers recorded in `dir`.
pub fn addresses(dir: &Path) -> Vec<String> {
    servers(dir).into_iter().map(|server| server.address).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_files_override_the_launchers_list() {
        let dir = std::env::temp_dir().join(format!("ringfs-run-dir-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("servers"), "server-0 127.0.0.1:1 10\nserver-1 127.0.0.1:2 11\n").unwrap();
        std::fs::write(dir.join("server-1.addr"), "127.0.0.1:22\n").unwrap();
        std::fs::write(dir.join("server-2.addr"), "127.0.0.1:3").unwrap();
        assert_eq!(addresses(&dir), ["127.0.0.1:1", "127.0.0.1:22", "127.0.0.1:3"]);
        assert!(addresses(&dir.join("missing")).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Sets `dir`'s modification time to one fixed time long ago (older than `RECENT_CHANGE`,
    /// and the same at every call).
    fn age(dir: &Path) {
        let long_ago = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        std::fs::File::open(dir).unwrap().set_modified(long_ago).unwrap();
    }

    /// Rewrites `path` in place (the directory's time does not change; a server's own
    /// rewrite renames, which changes it).
    fn rewrite_in_place(dir: &Path, path: &Path, contents: &str) {
        std::fs::write(path, contents).unwrap();
        age(dir);
    }

    #[test]
    fn a_watch_reads_only_wanted_address_files_and_only_after_the_directory_changed() {
        let dir = std::env::temp_dir().join(format!("ringfs-run-dir-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("server-1.addr"), "127.0.0.1:1").unwrap();
        std::fs::write(dir.join("server-2.addr"), "127.0.0.1:2").unwrap();
        std::fs::write(dir.join("servers"), "server-3 127.0.0.1:3 10\n").unwrap();
        age(&dir);
        let watch = RunDirWatch::new(&dir);
        let names = |servers: Vec<RunDirServer>| {
            servers.into_iter().map(|server| format!("{} {}", server.name, server.address)).collect::<Vec<_>>()
        };

        assert_eq!(names(watch.servers(|name| name != "server-2")), ["server-1 127.0.0.1:1", "server-3 127.0.0.1:3"]);
        // Unchanged directory: server-1's file is not read again; server-2's is read the first
        // time it is wanted.
        rewrite_in_place(&dir, &dir.join("server-1.addr"), "127.0.0.1:11");
        rewrite_in_place(&dir, &dir.join("server-2.addr"), "127.0.0.1:22");
        assert_eq!(names(watch.servers(|_| true)), ["server-1 127.0.0.1:1", "server-2 127.0.0.1:22", "server-3 127.0.0.1:3"]);
        // A server's rewrite (a new file renamed over the old one) changes the directory:
        // every wanted file is read again.
        std::fs::write(dir.join("server-4.addr.tmp"), "127.0.0.1:4").unwrap();
        std::fs::rename(dir.join("server-4.addr.tmp"), dir.join("server-4.addr")).unwrap();
        assert_eq!(
            names(watch.servers(|_| true)),
            ["server-1 127.0.0.1:11", "server-2 127.0.0.1:22", "server-3 127.0.0.1:3", "server-4 127.0.0.1:4"]
        );
        // A directory changed within RECENT_CHANGE is listed at every look (coarse times).
        std::fs::write(dir.join("server-4.addr"), "127.0.0.1:44").unwrap();
        assert_eq!(names(watch.servers(|name| name == "server-4")), ["server-4 127.0.0.1:44"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
