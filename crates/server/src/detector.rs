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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Action, Filter, TestCluster};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    // Short times so that a test takes a second or two: pings every 50 ms, a member is dead
    // after 400 ms of silence, a ping waits at least 200 ms.
    const INTERVAL: Duration = Duration::from_millis(50);
    const FAILURE_TIMEOUT: Duration = Duration::from_millis(400);

    /// A cluster of three, the detector of `s0`, and the name of the member it watches.
    fn watching() -> (TestCluster, FailureDetector, String) {
        let cluster = TestCluster::new(3);
        let successor = cluster.servers[0].node.membership().successor_of("s0").expect("s0 has a successor").name.clone();
        (cluster, FailureDetector::new(INTERVAL, FAILURE_TIMEOUT), successor)
    }

    fn alive(cluster: &TestCluster, name: &str) -> bool {
        cluster.servers[0].node.membership().list().members.iter().any(|member| member.name == name && member.alive)
    }

    /// Rounds of `detector` on s0 (each waiting `wait` for the interval) until `successor`
    /// is declared dead; the number of rounds it took, or `None` if it is still alive after
    /// `rounds`.
    fn rounds_until_dead(
        cluster: &TestCluster,
        detector: &mut FailureDetector,
        successor: &str,
        rounds: usize,
        wait: impl Fn(Duration),
    ) -> Option<usize> {
        (1..=rounds).find(|_| {
            detector.round(&cluster.servers[0].node, |interval| {
                wait(interval);
                false
            });
            !alive(cluster, successor)
        })
    }

    #[test]
    fn a_successor_whose_answers_come_within_the_failure_timeout_stays_alive() {
        // Every answer takes 300 ms: longer than the shortest ping deadline (200 ms), shorter
        // than the failure timeout. A detector whose pings gave up at 200 ms declared it dead
        // in its second round.
        let (cluster, mut detector, successor) = watching();
        cluster.net.add(Filter::new("Ping", Action::Delay(Duration::from_millis(300))).to(&successor).on_answer());
        let died = rounds_until_dead(&cluster, &mut detector, &successor, 8, std::thread::sleep);
        assert_eq!(died, None, "{successor} answered every ping in 300 ms but was declared dead");
        assert!(cluster.net.caught("Ping") >= 8);
    }

    #[test]
    fn a_detector_that_woke_late_does_not_blame_its_successor_for_it() {
        // The detector's thread does not run for a second (the node is overloaded); when it
        // wakes, its successor's answer takes 300 ms. That second is not the successor's
        // silence: it has its whole failure timeout to answer. Counted against it, the
        // successor was declared dead by the first ping after the wake-up.
        let (cluster, mut detector, successor) = watching();
        assert_eq!(rounds_until_dead(&cluster, &mut detector, &successor, 2, std::thread::sleep), None);
        cluster.net.add(Filter::new("Ping", Action::Delay(Duration::from_millis(300))).to(&successor).on_answer());
        let overslept = |interval| std::thread::sleep(interval + Duration::from_secs(1));
        assert_eq!(
            rounds_until_dead(&cluster, &mut detector, &successor, 1, overslept),
            None,
            "{successor} was blamed for the detector's own sleep"
        );
        assert_eq!(rounds_until_dead(&cluster, &mut detector, &successor, 3, std::thread::sleep), None);
    }

    #[test]
    fn a_successor_only_this_server_cannot_reach_is_not_declared_dead() {
        // s0's pings to its successor are lost (a broken path between the two); the third
        // server reaches it. Without asking the third, s0 declared it dead in its 9th round.
        let (cluster, mut detector, successor) = watching();
        cluster.net.add(Filter::new("Ping", Action::Drop).from("s0").to(&successor));
        let died = rounds_until_dead(&cluster, &mut detector, &successor, 20, std::thread::sleep);
        assert_eq!(died, None, "{successor} answers the other server but was declared dead");
        assert!(cluster.net.delivered("ProbeFor").iter().all(|delivery| delivery.from == "s0" && delivery.to != successor));
        assert!(!cluster.net.delivered("ProbeFor").is_empty(), "s0 never asked another server");
    }

    #[test]
    fn a_successor_that_refuses_every_ping_is_declared_dead_after_the_failure_timeout() {
        // As a killed server: every ping fails at once.
        let (cluster, mut detector, successor) = watching();
        cluster.net.add(Filter::new("Ping", Action::Drop).to(&successor));
        let started = Instant::now();
        let died = rounds_until_dead(&cluster, &mut detector, &successor, 40, std::thread::sleep);
        assert!(died.is_some(), "{successor} refused every ping for 40 rounds and is still alive");
        assert!(started.elapsed() >= FAILURE_TIMEOUT, "declared dead after {:?}", started.elapsed());
        assert!(!alive(&cluster, &successor));
    }

    #[test]
    fn neighbours_that_stop_together_are_both_declared_dead_by_the_one_before_them() {
        // s0's successor and the successor's successor both stop answering everybody: once
        // the first is dead, s0 watches the second (its watcher is gone).
        let cluster = TestCluster::new(4);
        let node = &cluster.servers[0].node;
        let first = node.membership().successor_of("s0").expect("a successor").name.clone();
        let second = node.membership().successor_of(&first).expect("a successor").name.clone();
        for name in [&first, &second] {
            cluster.net.add(Filter::new("Ping", Action::Drop).to(name));
        }
        let mut detector = FailureDetector::new(INTERVAL, FAILURE_TIMEOUT);
        let first_died = rounds_until_dead(&cluster, &mut detector, &first, 40, std::thread::sleep);
        assert!(first_died.is_some(), "{first} never declared dead");
        assert_eq!(node.membership().successor_of("s0").map(|member| member.name.clone()), Some(second.clone()));
        let second_died = rounds_until_dead(&cluster, &mut detector, &second, 40, std::thread::sleep);
        assert!(second_died.is_some(), "{second} never declared dead after {first}");
    }

    #[test]
    fn a_successor_that_never_answers_is_declared_dead_by_one_long_ping() {
        // As a stopped server: the ping waits out the whole failure timeout.
        let (cluster, mut detector, successor) = watching();
        let never = Arc::new(AtomicBool::new(true));
        cluster.net.add(Filter::new("Ping", Action::Hold { release: never.clone() }).to(&successor).on_answer());
        let died = rounds_until_dead(&cluster, &mut detector, &successor, 3, std::thread::sleep);
        assert!(
            matches!(died, Some(1 | 2)),
            "a ping should wait out the failure timeout and its silence end it (dead after {died:?} rounds)"
        );
        never.store(false, Ordering::SeqCst);
    }

    #[test]
    fn a_starved_detector_still_declares_a_dead_successor_dead() {
        // Every wake-up 100 ms late: only the detector's own running time counts, so it takes
        // more rounds, but the verdict comes.
        let (cluster, mut detector, successor) = watching();
        cluster.net.add(Filter::new("Ping", Action::Drop).to(&successor));
        let late = |interval| std::thread::sleep(interval + Duration::from_millis(100));
        let died = rounds_until_dead(&cluster, &mut detector, &successor, 40, late);
        let died = died.expect("a starved detector never declared a silent successor dead");
        assert!(died >= 6, "declared dead in round {died}: the detector's lateness was counted as silence");
    }
}
