//! The member list: which servers form the file system, and which of them are alive.
//!
//! Every server holds its own view, a [`MemberList`] with an epoch. Views spread by gossip:
//! a server that changes its view itself (admits a joining server, declares one dead,
//! refutes its own death) raises its epoch and pushes its view to the others, a server that
//! receives a view merges it (and answers with its own if the sender lacked something), and
//! every heartbeat each server exchanges views with one other in turn, which mends what a
//! lost push left out. Merging takes, for each member, the entry with the higher
//! *incarnation*, so views converge whatever order pushes arrive in.
//!
//! A member that stops answering is declared dead (its incarnation raised, `alive` false)
//! but keeps its place in the ring: placement never changes because a server died, so data
//! on the other servers stays reachable, and a restarted server (same name, higher
//! incarnation) serves its `dir` store again. A live server that hears it was declared dead
//! refutes it by raising its own incarnation.

use std::collections::HashMap;

use ringfs_placement::{HashFunction, MemberRing, Scheme};
use ringfs_proto::{ChunkIndex, Member, MemberList};

/// One server's view of the cluster, with the placement derived from it.
pub struct Membership {
    ring: MemberRing,
}

impl Membership {
    /// A view that contains only this server.
    pub fn new(own: Member, hash: HashFunction, scheme: Scheme) -> Membership {
        let list = MemberList { epoch: 1, placement: ringfs_placement::describe(scheme, hash), members: vec![own] };
        Membership { ring: MemberRing::new(list).expect("one member, placed as described") }
    }

    /// Takes `list` as the view (placed anew).
    fn set(&mut self, list: MemberList) {
        self.ring = MemberRing::new(list).expect("member names stay unique and the list is never empty");
    }

    pub fn list(&self) -> &MemberList {
        self.ring.list()
    }

    pub fn epoch(&self) -> u64 {
        self.list().epoch
    }

    /// Raises the view's epoch to `epoch` if it is lower (a server with the same members
    /// said so): the views that agree agree on the higher epoch.
    pub fn raise_epoch(&mut self, epoch: u64) {
        if epoch > self.epoch() {
            self.ring.set_epoch(epoch);
        }
    }

    pub fn member(&self, name: &str) -> Option<&Member> {
        self.ring.member(name)
    }

    /// The member that owns chunk `index` of the files with this anchor.
    pub fn owner(&self, anchor: u32, index: ChunkIndex) -> &Member {
        self.ring.owner(anchor, index)
    }

    /// The members that own chunks `first..=last` of the files with this anchor, each once.
    pub fn owners_of_chunks(&self, anchor: u32, first: ChunkIndex, last: ChunkIndex) -> Vec<&Member> {
        self.ring.owners_of_chunks(anchor, first, last)
    }

    /// The member that owns the entry of `path`.
    pub fn owner_of_path(&self, path: &str) -> &Member {
        self.ring.owner_of_path(path)
    }

    /// The anchor of a file created at `path` (see `ringfs_placement::Placement::anchor_of`).
    pub fn anchor_of(&self, path: &str) -> u32 {
        self.ring.anchor_of(path)
    }

    /// The member at the first position of the ring: it holds the namespace lock of directory
    /// renames (fixed, so that every server asks the same one).
    pub fn first_in_ring(&self) -> &Member {
        self.ring.first_in_ring()
    }

    /// The members in ring order.
    pub fn ring_order(&self) -> impl Iterator<Item = &Member> {
        self.ring.in_ring_order()
    }

    pub fn alive_members(&self) -> impl Iterator<Item = &Member> {
        self.list().members.iter().filter(|member| member.alive)
    }

    /// The next alive member after `name` in ring order (the one `name` watches).
    pub fn successor_of(&self, name: &str) -> Option<&Member> {
        self.ring.successor_of(name)
    }

    /// Admits a joining (or restarted) member. Returns false if the view already had an
    /// entry at least as new.
    pub fn admit(&mut self, member: Member) -> bool {
        let mut list = self.list().clone();
        match list.members.iter_mut().find(|existing| existing.name == member.name) {
            Some(existing) if existing.incarnation >= member.incarnation => return false,
            Some(existing) => *existing = member,
            None => list.members.push(member),
        }
        list.epoch = list.epoch.saturating_add(1);
        self.set(list);
        true
    }

    /// Declares a member dead. Returns false if it was not alive.
    pub fn declare_dead(&mut self, name: &str) -> bool {
        let mut list = self.list().clone();
        let Some(member) = list.members.iter_mut().find(|member| member.name == name && member.alive) else {
            return false;
        };
        member.alive = false;
        member.incarnation = member.incarnation.saturating_add(1);
        list.epoch = list.epoch.saturating_add(1);
        self.set(list);
        true
    }

    /// Merges another view into this one (`own_name` is this server), and says what that
    /// changed.
    pub fn merge(&mut self, incoming: &MemberList, own_name: &str) -> Merged {
        if incoming.placement != self.list().placement {
            log::error!("ignoring a member list with placement {} (ours is {})", incoming.placement, self.list().placement);
            return Merged::default();
        }
        let mut list = self.list().clone();
        let mut merged = Merged::default();
        // Where each name is in `list` (names added below too: a name twice in `incoming`
        // is taken once).
        let mut ours_at: HashMap<&str, usize> =
            self.list().members.iter().enumerate().map(|(at, member)| (member.name.as_str(), at)).collect();
        for theirs in &incoming.members {
            match ours_at.get(theirs.name.as_str()).map(|at| &mut list.members[*at]) {
                None => {
                    ours_at.insert(&theirs.name, list.members.len());
                    list.members.push(theirs.clone());
                    merged.learned = true;
                }
                Some(ours) if ours.name == own_name => {
                    if !theirs.alive && theirs.incarnation >= ours.incarnation {
                        // Refute a false report of our death.
                        ours.incarnation = theirs.incarnation.saturating_add(1);
                        merged.refuted = true;
                    }
                }
                Some(ours) if theirs.incarnation > ours.incarnation => {
                    *ours = theirs.clone();
                    merged.learned = true;
                }
                Some(_) => {}
            }
        }
        let theirs: HashMap<&str, u64> = incoming.members.iter().map(|member| (member.name.as_str(), member.incarnation)).collect();
        merged.sender_behind =
            list.members.iter().any(|ours| theirs.get(ours.name.as_str()).is_none_or(|incarnation| *incarnation < ours.incarnation));
        list.epoch = if merged.changed() { list.epoch.max(incoming.epoch).saturating_add(1) } else { list.epoch.max(incoming.epoch) };
        if merged.learned || merged.refuted {
            self.set(list);
        } else {
            // The same members: the ring stands (placing them anew costs O(members)).
            self.ring.set_epoch(list.epoch);
        }
        merged
    }
}

/// What merging another server's member list did (see [`Membership::merge`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    /// This view learnt of a member, or of a newer state of one.
    pub learned: bool,
    /// The other view reported this server dead, and this view refutes it (a newer
    /// incarnation of this server, which the others must hear).
    pub refuted: bool,
    /// The other view lacks something this one knows (it should be told).
    pub sender_behind: bool,
}

impl Merged {
    /// Whether the two views differed.
    pub fn changed(&self) -> bool {
        self.learned || self.refuted || self.sender_behind
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, incarnation: u64) -> Member {
        Member {
            name: name.into(),
            tcp_address: format!("{name}:1"),
            unix_path: String::new(),
            host_id: 1,
            pid: 1,
            alive: true,
            incarnation,
        }
    }

    fn names(view: &Membership) -> Vec<String> {
        let mut names: Vec<String> = view.list().members.iter().map(|m| m.name.clone()).collect();
        names.sort();
        names
    }

    #[test]
    fn concurrent_joins_at_different_servers_converge() {
        let mut a = Membership::new(member("a", 1), HashFunction::Koyama, Scheme::Modular);
        let mut b = Membership::new(member("b", 1), HashFunction::Koyama, Scheme::Modular);
        b.merge(a.list(), "b");
        a.merge(b.list(), "a");
        assert!(a.admit(member("c", 1)));
        assert!(b.admit(member("d", 1)));
        // Pushes cross; each side pushes again while the other lacks something.
        let mut rounds = 0;
        while a.merge(&b.list().clone(), "a").changed() | b.merge(&a.list().clone(), "b").changed() {
            rounds += 1;
            assert!(rounds < 5, "gossip must converge");
        }
        assert_eq!(names(&a), ["a", "b", "c", "d"]);
        assert_eq!(names(&b), names(&a));
        assert_eq!(a.ring.placement().ring(), b.ring.placement().ring());
    }

    #[test]
    fn a_dead_member_keeps_its_place_and_can_come_back() {
        let mut view = Membership::new(member("a", 1), HashFunction::Koyama, Scheme::Modular);
        view.admit(member("b", 1));
        let owner_before = view.owner_of_path("/x").name.clone();
        assert!(view.declare_dead("b"));
        assert!(!view.declare_dead("b"));
        assert_eq!(view.owner_of_path("/x").name, owner_before);
        assert_eq!(view.alive_members().count(), 1);
        // An older "alive" report does not revive it; a restart (newer incarnation) does.
        let old_report = MemberList { epoch: 1, placement: view.list().placement.clone(), members: vec![member("b", 1)] };
        view.merge(&old_report, "a");
        assert!(!view.member("b").unwrap().alive);
        assert!(view.admit(member("b", 10)));
        assert!(view.member("b").unwrap().alive);
    }

    #[test]
    fn a_live_server_refutes_its_reported_death() {
        let mut view = Membership::new(member("a", 5), HashFunction::Koyama, Scheme::Modular);
        let rumour = MemberList {
            epoch: 9,
            placement: view.list().placement.clone(),
            members: vec![Member { alive: false, incarnation: 6, ..member("a", 5) }],
        };
        assert!(view.merge(&rumour, "a").refuted);
        let own = view.member("a").unwrap();
        assert!(own.alive && own.incarnation == 7);
        assert!(view.epoch() > 9);
    }

    #[test]
    fn a_list_naming_a_server_twice_adds_it_once() {
        let mut view = Membership::new(member("a", 1), HashFunction::Koyama, Scheme::Modular);
        let twice = MemberList { epoch: 2, placement: view.list().placement.clone(), members: vec![member("b", 1), member("b", 2)] };
        assert!(view.merge(&twice, "a").learned);
        assert_eq!(names(&view), ["a", "b"]);
    }

    #[test]
    fn successor_skips_dead_members() {
        let mut view = Membership::new(member("s0", 1), HashFunction::Koyama, Scheme::Modular);
        view.admit(member("s1", 1));
        view.admit(member("s2", 1));
        assert_eq!(view.successor_of("s0").unwrap().name, "s1");
        view.declare_dead("s1");
        assert_eq!(view.successor_of("s0").unwrap().name, "s2");
        assert_eq!(view.successor_of("s2").unwrap().name, "s0");
    }
}
