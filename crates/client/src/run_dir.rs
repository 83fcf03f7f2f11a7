//! The run directory of a cluster, as clients read it.
//!
//! `ringfs start` keeps a cluster's state in a run directory: the secret, and for every server
//! `<name>.addr` (its current TCP address) and `<name>.pid` (host and process id), which the
//! server rewrites each time it starts — also when it is restarted by hand on a new port. The
//! run directory is therefore the source of truth for where the servers are: clients with
//! `RINGFS_RUN_DIR` set look there when the addresses they were given stop answering.

use std::path::Path;

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
    let mut servers: Vec<RunDirServer> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().and_then(|name| name.strip_suffix(".addr")) else { continue };
            let Ok(address) = std::fs::read_to_string(entry.path()) else { continue };
            let address = address.trim();
            if !address.is_empty() {
                servers.push(RunDirServer { name: name.to_string(), address: address.to_string() });
            }
        }
    }
    if let Ok(listed) = std::fs::read_to_string(dir.join("servers")) {
        for line in listed.lines() {
            let mut words = line.split_whitespace();
            let (Some(name), Some(address)) = (words.next(), words.next()) else { continue };
            if !servers.iter().any(|server| server.name == name) {
                servers.push(RunDirServer { name: name.to_string(), address: address.to_string() });
            }
        }
    }
    servers.sort_by(|a, b| a.name.cmp(&b.name));
    servers
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
}
