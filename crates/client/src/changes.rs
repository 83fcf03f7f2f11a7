//! What other clients changed lately (`Changes`), for a FUSE mount that lets the kernel keep
//! names and attributes long and tells it to drop what changed elsewhere: every server keeps
//! a log of the files and names changed there (`crates/server/src/changes.rs`), and a watcher
//! keeps its place in each.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ringfs_proto::{ChangesSince, Errno, FileId, NameMove, Request, Response};

use crate::{Client, Result};

/// Where a watcher stands in each server's change log, by server name.
#[derive(Debug, Default)]
pub struct ChangeWatch {
    positions: HashMap<String, (u64, u64)>,
    /// When each server is asked next, if the watch is paced ([`ChangeWatch::pace`]).
    pacing: Option<Pacing>,
}

/// How often a paced watch asks each server.
#[derive(Debug)]
struct Pacing {
    /// The interval of a server whose last answer had news.
    busy: Duration,
    /// The longest interval of a server with nothing new.
    quiet: Duration,
    /// The most questions a second the watch asks all servers together: with more servers
    /// than `busy` allows at this rate, each is asked less often (see [`ChangeWatch::pace`]).
    per_second: u32,
    /// By server: its interval now, and when it is asked next.
    next: HashMap<String, (Duration, Instant)>,
}

impl Pacing {
    /// The shortest interval with `servers` servers: `busy`, or longer where asking that
    /// many servers that often would pass `per_second`.
    fn shortest(&self, servers: usize) -> Duration {
        self.busy.max(Duration::from_secs_f64(servers as f64 / f64::from(self.per_second.max(1))))
    }
}

impl ChangeWatch {
    /// From now on [`Client::changes`] asks a server only when it is due: `busy` after an
    /// answer with news, and after each answer without, twice as long as before, up to
    /// `quiet`. Every mount asks every server, so an idle job of N nodes with a mount on
    /// each costs every server N requests per `quiet`, not per `busy`. And the watch asks
    /// at most `per_second` questions a second of all servers together: with N servers,
    /// each is asked at most every N / `per_second` seconds (when that is longer than
    /// `busy`), so that a job with a mount on each node costs each server at most
    /// `per_second` questions a second however large it is, and a change elsewhere shows
    /// within about that interval.
    pub fn pace(&mut self, busy: Duration, quiet: Duration, per_second: u32) {
        self.pacing = Some(Pacing { busy, quiet: quiet.max(busy), per_second, next: HashMap::new() });
    }

    /// Whether `server` is to be asked at `now`.
    fn due(&self, server: &str, now: Instant) -> bool {
        self.pacing.as_ref().is_none_or(|pacing| pacing.next.get(server).is_none_or(|(_, next)| now >= *next))
    }

    /// `server`, one of `servers`, was asked at `now`; `news`: its answer had some.
    fn asked(&mut self, server: &str, servers: usize, news: bool, now: Instant) {
        let Some(pacing) = &mut self.pacing else { return };
        let shortest = pacing.shortest(servers);
        let interval = match pacing.next.get(server) {
            Some((interval, _)) if !news => (*interval * 2).min(pacing.quiet.max(shortest)).max(shortest),
            _ => shortest,
        };
        pacing.next.insert(server.to_string(), (interval, now + interval));
    }
}

/// What other clients changed since the last look.
#[derive(Debug, Default)]
pub struct Changes {
    /// Files whose attributes or bytes changed.
    pub files: Vec<FileId>,
    /// Names created, removed or replaced.
    pub names: Vec<String>,
    /// Renames made, each server's in the order it made them.
    pub moves: Vec<NameMove>,
    /// False when a server could not tell (first look, a restart, or more changes since the
    /// last look than it keeps): anything may have changed.
    pub complete: bool,
}

impl Client {
    /// Asks every live server (of a paced watch: every one due) what clients other than this
    /// one changed since `watch`'s last look, and moves `watch` on. Fails (moving nothing) if
    /// a server does not answer.
    pub fn changes(&self, watch: &mut ChangeWatch) -> Result<Changes> {
        let cluster = &self.inner.cluster;
        let now = Instant::now();
        let alive: Vec<_> = cluster.member_list().members.into_iter().filter(|member| member.alive).collect();
        let servers = alive.len();
        let members: Vec<_> = alive.into_iter().filter(|member| watch.due(&member.name, now)).collect();
        let connections = members.iter().map(|member| cluster.connection(member)).collect::<Result<Vec<_>>>()?;
        let calls: Vec<_> = members
            .iter()
            .zip(&connections)
            .map(|(member, connection)| {
                let (epoch, after) = watch.positions.get(&member.name).copied().unwrap_or((0, 0));
                connection.start(&Request::Changes(ChangesSince { epoch, after, client: self.inner.client_id }), &[], None)
            })
            .collect();
        let mut lists = Vec::with_capacity(calls.len());
        for (connection, call) in connections.iter().zip(calls) {
            match cluster.finish(connection, call)?.response {
                Response::ChangeList(list) => lists.push(list),
                _ => return Err(Errno::EPROTO),
            }
        }
        let mut changes = Changes { complete: true, ..Changes::default() };
        for (member, list) in members.iter().zip(lists) {
            watch.positions.insert(member.name.clone(), (list.epoch, list.last));
            let news = !list.complete || !list.files.is_empty() || !list.names.is_empty() || !list.moves.is_empty();
            watch.asked(&member.name, servers, news, now);
            changes.complete &= list.complete;
            changes.files.extend(list.files);
            changes.names.extend(list.names);
            changes.moves.extend(list.moves);
        }
        Ok(changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paced_watch_asks_a_quiet_server_less_and_less_often_and_a_busy_one_at_once_again() {
        let mut watch = ChangeWatch::default();
        let start = Instant::now();
        assert!(watch.due("a", start), "an unpaced watch asks every server every time");
        watch.pace(Duration::from_millis(100), Duration::from_secs(1), 1000);
        assert!(watch.due("a", start), "a server never asked is due");
        let mut now = start;
        let mut intervals = Vec::new();
        for news in [false, false, false, false, false, false, true, false] {
            watch.asked("a", 10, news, now);
            let (interval, next) = watch.pacing.as_ref().unwrap().next["a"];
            assert!(!watch.due("a", next - Duration::from_millis(1)) && watch.due("a", next));
            intervals.push(interval.as_millis());
            now = next;
        }
        // (The first answer sets the busy interval; each quiet one doubles it up to 1 s.)
        assert_eq!(intervals, [100, 200, 400, 800, 1000, 1000, 100, 200]);
        assert!(watch.due("b", now), "servers are paced one by one");
    }

    #[test]
    fn a_paced_watch_of_many_servers_asks_each_less_often_within_its_budget() {
        let mut watch = ChangeWatch::default();
        watch.pace(Duration::from_millis(100), Duration::from_secs(1), 1000);
        let now = Instant::now();
        let interval = |watch: &ChangeWatch, server: &str| watch.pacing.as_ref().unwrap().next[server].0;
        // 100 servers at 1,000 questions a second: every 100 ms, as without a budget.
        watch.asked("a", 100, true, now);
        assert_eq!(interval(&watch, "a"), Duration::from_millis(100));
        // 5,000 servers: each every 5 s, busy or quiet, so each is asked 1,000 times a
        // second by 5,000 such mounts.
        watch.asked("a", 5000, true, now);
        assert_eq!(interval(&watch, "a"), Duration::from_secs(5));
        watch.asked("a", 5000, false, now);
        assert_eq!(interval(&watch, "a"), Duration::from_secs(5), "the quiet interval is no shorter");
        // 2,000: busy every 2 s, quiet ones back off no further than that.
        watch.asked("b", 2000, true, now);
        watch.asked("b", 2000, false, now);
        assert_eq!(interval(&watch, "b"), Duration::from_secs(2));
    }
}
