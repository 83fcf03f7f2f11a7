//! The failure detector (`detector.rs`) on the in-process test network: slow answers,
//! a starved detector, a path only one server cannot use, neighbours stopping together.
//! (Its own file, as the coordinators' tests: `testing` builds on the dispatcher, which
//! answers the detector's probes.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::detector::FailureDetector;
use crate::testing::{Action, Filter, TestCluster};

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
    assert!(matches!(died, Some(1 | 2)), "a ping should wait out the failure timeout and its silence end it (dead after {died:?} rounds)");
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
