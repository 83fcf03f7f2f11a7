//! Failure detection: each server pings its ring successor every heartbeat interval and
//! declares it dead after the failure timeout without an answer (ARCHITECTURE.md,
//! "Membership: dead servers keep their place").
//!
//! Servers run on compute nodes beside the job, so a detector must expect to be starved of
//! CPU now and then, and so must the server it watches. A false declaration costs the job
//! EIO for the watched server's keys until it rejoins, so the detector counts as silence
//! only what it could have heard:
//! - **A ping waits as long as the successor still has to answer**: until the failure timeout
//!   since its last answer (at least the short ping deadline). A slow answer that comes
//!   within the failure timeout is an answer (a fixed 2-s ping deadline declared a server
//!   dead whose every answer came in 2–5 s).
//! - **The detector's own late wake-ups are not the successor's silence**: when its wait
//!   or its ping returns much later than it asked (its thread did not run: the node is
//!   overloaded, or the process was stopped), that time is added to the successor's
//!   allowance. So a dead server is still declared dead after the failure timeout of the
//!   detector's own running time, and a starved detector does not blame its successor for
//!   the time it was not looking — in the spirit of Lifeguard's local health awareness
//!   (Dadgar et al., 2018), which slows a member's verdicts while it is itself unwell.
//! - **Others are asked before a verdict** (SWIM's indirect probe, Das et al., 2002): with
//!   one watcher per server, a slow or broken path between two servers alone would make the
//!   watched one dead for everybody. Before declaring its successor dead, the detector asks
//!   up to [`INDIRECT_PROBES`] other servers to ping it (`ProbeFor`); if one of them hears
//!   it, it stays alive. That costs a hung server's detection one short ping deadline more.
//!
//! A killed server refuses the connection at once; the detector then pings again every
//! interval until the failure timeout has passed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ringfs_proto::{Errno, Member, ProbeFor, Request, Response};

use crate::node::Node;

/// Other servers asked to ping a silent successor before it is declared dead.
pub const INDIRECT_PROBES: usize = 2;
/// The longest a server pings a member for another server's `ProbeFor` (the asker says how
/// long; this bounds what a malformed request can make a handler wait).
const LONGEST_PROBE: Duration = Duration::from_secs(10);

/// Lateness of the detector's own wake-ups that is taken as ordinary scheduling delay (not
/// discounted).
const ORDINARY_LATENESS: Duration = Duration::from_millis(50);

/// The failure detector of one server (runs on the `ringfs-detector` thread).
pub struct FailureDetector {
    interval: Duration,
    failure_timeout: Duration,
    /// The shortest time a ping waits for its answer.
    ping_deadline: Duration,
    /// For each watched member: since when it has not answered, on the detector's own
    /// clock (moved forward by the time the detector itself was late).
    silent_since: HashMap<String, Instant>,
}

impl FailureDetector {
    /// A detector pinging every `interval` and declaring a member dead after
    /// `failure_timeout` without an answer.
    pub fn new(interval: Duration, failure_timeout: Duration) -> FailureDetector {
        let ping_deadline = failure_timeout.min(interval.max(Duration::from_millis(100)) * 2);
        FailureDetector { interval, failure_timeout, ping_deadline, silent_since: HashMap::new() }
    }

    /// Watches the successor until the server shuts down.
    pub fn run(mut self, node: &Node) {
        while self.round(node, |interval| node.shutdown.wait(interval)) {}
    }

    /// One heartbeat: `wait` for the interval (it returns true when the server shuts down,
    /// and may return late), then ping the successor. Returns false at shutdown.
    pub(crate) fn round(&mut self, node: &Node, wait: impl FnOnce(Duration) -> bool) -> bool {
        let asleep = Instant::now();
        if wait(self.interval) {
            return false;
        }
        self.excuse(asleep.elapsed().saturating_sub(self.interval));
        let Some(successor) = node.membership().successor_of(&node.name).cloned() else { return true };
        let now = Instant::now();
        let silent_since = *self.silent_since.entry(successor.name.clone()).or_insert(now);
        let patience = (silent_since + self.failure_timeout).saturating_duration_since(now).max(self.ping_deadline);
        let answered = node.ping(&successor, patience);
        let late = now.elapsed().saturating_sub(patience);
        if answered {
            self.silent_since.insert(successor.name, Instant::now());
            return true;
        }
        self.excuse(late);
        let silent_since = self.silent_since[&successor.name];
        if silent_since.elapsed() >= self.failure_timeout {
            if self.others_hear(node, &successor) {
                log::warn!("server {} does not answer this server but answers others; not declared dead", successor.name);
                self.silent_since.insert(successor.name, Instant::now());
                return true;
            }
            log::warn!("server {} stopped answering; declaring it dead", successor.name);
            if node.membership_mut().declare_dead(&successor.name) {
                node.spread_members();
            }
            self.silent_since.remove(&successor.name);
        }
        true
    }

    /// Whether one of up to [`INDIRECT_PROBES`] other servers (the suspect's next ones on
    /// the ring) hears `suspect` within a short ping deadline.
    fn others_hear(&self, node: &Node, suspect: &Member) -> bool {
        let probe = Request::ProbeFor(ProbeFor {
            name: suspect.name.clone(),
            timeout_ms: u32::try_from(self.ping_deadline.as_millis()).unwrap_or(u32::MAX),
        });
        let helpers: Vec<(Member, Request)> = {
            let membership = node.membership();
            let mut helpers = Vec::new();
            let mut at = suspect.name.clone();
            for _ in 0..membership.list().members.len() {
                let Some(next) = membership.successor_of(&at) else { break };
                if next.name == suspect.name || helpers.len() == INDIRECT_PROBES {
                    break;
                }
                at = next.name.clone();
                if next.name != node.name {
                    helpers.push((next.clone(), probe.clone()));
                }
            }
            helpers
        };
        if helpers.is_empty() {
            return false;
        }
        // The helpers wait `ping_deadline` for the suspect; the answer needs a moment more.
        let until = Instant::now() + self.ping_deadline * 3 / 2;
        node.ask_each(&helpers, Some(until)).iter().any(|answer| matches!(answer, Ok(Response::Done)))
    }

    /// The detector ran `late` later than it asked to: that time is nobody's silence.
    fn excuse(&mut self, late: Duration) {
        if late <= ORDINARY_LATENESS {
            return;
        }
        log::debug!("the failure detector woke {} ms late; not counted against its successor", late.as_millis());
        for since in self.silent_since.values_mut() {
            *since += late;
        }
    }
}

/// Answers another server's `ProbeFor`: pings the member it names, for as long as it asks
/// (at most [`LONGEST_PROBE`]).
pub fn answer_probe(node: &Node, probe: &ProbeFor) -> Result<Response, Errno> {
    let member = node.membership().list().members.iter().find(|member| member.name == probe.name).cloned().ok_or(Errno::ENOENT)?;
    if node.is_self(&member) {
        return Ok(Response::Done);
    }
    let timeout = Duration::from_millis(u64::from(probe.timeout_ms)).min(LONGEST_PROBE);
    if node.ping(&member, timeout) { Ok(Response::Done) } else { Err(Errno::ETIMEDOUT) }
}
