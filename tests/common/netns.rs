//! A small network of Linux network namespaces for tests: one namespace per server and one
//! for the clients, each joined by a veth pair to a bridge in a "switch" namespace. A server
//! is cut off by taking its port on the switch down, and reconnected by bringing it up again
//! (this kernel has no `netem`: delay and loss come from the relay or the simulated network).
//!
//! Everything lives in namespaces this harness creates (named `rf<pid>-…`, addresses in
//! 10.201.0.0/24 that exist nowhere else) and is deleted when the [`Network`] is dropped,
//! also when the test fails. Creating namespaces needs root and `ip` (iproute2):
//! [`Network::create`] answers `None` where that is missing, and tests then skip unless
//! `RINGFS_REQUIRE_NETNS=1` (set by `./test.sh` where the probe works) makes it a failure.

use std::process::Command;
use std::thread;

/// One server's place in the network.
#[derive(Clone, Debug)]
pub struct NetHost {
    /// The namespace the server runs in.
    pub netns: String,
    /// Its address there.
    pub ip: String,
}

pub struct Network {
    tag: String,
    servers: usize,
    /// Namespaces created so far (all deleted on drop).
    created: Vec<String>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip").args(args).output().map_err(|error| format!("ip {}: {error}", args.join(" ")))?;
    if output.status.success() { Ok(()) } else { Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim())) }
}

impl Network {
    /// Creates the switch, `servers` server namespaces and the client namespace. `None` (with
    /// the reason printed) if namespaces cannot be made here; a failure then is a test
    /// failure only under `RINGFS_REQUIRE_NETNS=1`.
    pub fn create(servers: usize) -> Option<Network> {
        // Unique among concurrent test processes (interface names allow 15 bytes).
        let tag = format!("rf{}", (u64::from(std::process::id()) ^ ringfs_rpc::memory::random_u64()) % 100_000);
        let mut network = Network { tag, servers, created: Vec::new() };
        match network.build() {
            Ok(()) => Some(network),
            Err(reason) => {
                assert!(
                    std::env::var("RINGFS_REQUIRE_NETNS").as_deref() != Ok("1"),
                    "network namespaces are required here (RINGFS_REQUIRE_NETNS=1) but: {reason}"
                );
                eprintln!("skipped: no network namespaces here ({reason})");
                None
            }
        }
    }

    fn add_namespace(&mut self, name: &str) -> Result<(), String> {
        ip(&["netns", "add", name])?;
        self.created.push(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"])
    }

    fn build(&mut self) -> Result<(), String> {
        let switch = self.switch();
        self.add_namespace(&switch)?;
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &switch, "link", "set", "br0", "up"])?;
        for host in 0..=self.servers {
            let netns = self.host_netns(host);
            self.add_namespace(&netns)?;
            let port = self.port(host);
            ip(&["-n", &netns, "link", "add", "eth0", "type", "veth", "peer", "name", &port, "netns", &switch])?;
            ip(&["-n", &netns, "addr", "add", &format!("{}/24", Self::host_ip(host)), "dev", "eth0"])?;
            ip(&["-n", &netns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &switch, "link", "set", &port, "master", "br0", "up"])?;
        }
        Ok(())
    }

    fn switch(&self) -> String {
        format!("{}-sw", self.tag)
    }

    /// Host `servers` is the client's.
    fn host_netns(&self, host: usize) -> String {
        if host == self.servers { format!("{}-client", self.tag) } else { format!("{}-s{host}", self.tag) }
    }

    fn host_ip(host: usize) -> String {
        format!("10.201.0.{}", host + 1)
    }

    /// The switch's port towards a host (interface names have at most 15 bytes).
    fn port(&self, host: usize) -> String {
        format!("{}p{host}", self.tag)
    }

    /// Where each server runs (for [`super::ClusterOptions::hosts`]).
    pub fn server_hosts(&self) -> Vec<NetHost> {
        (0..self.servers).map(|host| NetHost { netns: self.host_netns(host), ip: Self::host_ip(host) }).collect()
    }

    /// Cuts server `server` off from everyone (its switch port goes down).
    pub fn cut(&self, server: usize) {
        ip(&["-n", &self.switch(), "link", "set", &self.port(server), "down"]).unwrap();
    }

    /// Connects server `server` again.
    pub fn reconnect(&self, server: usize) {
        ip(&["-n", &self.switch(), "link", "set", &self.port(server), "up"]).unwrap();
    }

    /// Runs `body` on a thread inside the client namespace: its connections, and those of
    /// the threads it starts, go through the network. Panics are passed on.
    pub fn in_client_namespace<T: Send>(&self, body: impl FnOnce() -> T + Send) -> T {
        let path = format!("/var/run/netns/{}", self.host_netns(self.servers));
        thread::scope(|scope| {
            let runner = scope.spawn(move || {
                let namespace = std::fs::File::open(&path).unwrap_or_else(|error| panic!("{path}: {error}"));
                use std::os::fd::AsRawFd;
                // SAFETY: a valid descriptor of a network namespace; setns changes only this
                // thread (and the threads it starts afterwards).
                assert_eq!(unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "setns into {path}");
                body()
            });
            runner.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of every veth pair, and so the pair.
        for netns in self.created.iter().rev() {
            if let Err(error) = ip(&["netns", "del", netns]) {
                eprintln!("cleanup: {error}");
            }
        }
    }
}
