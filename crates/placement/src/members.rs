//! A member list with its ring: the owner of every key as a [`Member`], computed alike by
//! clients and servers from the list a server handed out.

use ringfs_proto::{ChunkIndex, Member, MemberList};

use crate::{Placement, parse_description};

/// A member list and the placement it announces (`MemberList::placement`).
#[derive(Clone, Debug)]
pub struct MemberRing {
    list: MemberList,
    placement: Placement,
    /// For each ring position, the index of that member in `list.members`.
    ring_to_member: Vec<usize>,
}

impl MemberRing {
    /// Places `list` as it says it is placed. Fails for an unknown placement, an empty list or
    /// a name listed twice.
    pub fn new(list: MemberList) -> Result<MemberRing, String> {
        let (scheme, hash) = parse_description(&list.placement)?;
        let placement =
            Placement::new(list.members.iter().map(|member| member.name.clone()), hash, scheme).map_err(|error| error.to_string())?;
        let ring_to_member = placement
            .ring()
            .iter()
            .map(|name| list.members.iter().position(|member| &member.name == name).expect("the ring is built from the members"))
            .collect();
        Ok(MemberRing { list, placement, ring_to_member })
    }

    pub fn list(&self) -> &MemberList {
        &self.list
    }

    /// Sets the list's epoch (the members and the ring stay).
    pub fn set_epoch(&mut self, epoch: u64) {
        self.list.epoch = epoch;
    }

    /// The list, to change it (a new [`MemberRing`] places the changed list).
    pub fn into_list(self) -> MemberList {
        self.list
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    pub fn member(&self, name: &str) -> Option<&Member> {
        self.list.members.iter().find(|member| member.name == name)
    }

    /// The member at ring position `position`.
    pub fn at(&self, position: usize) -> &Member {
        &self.list.members[self.ring_to_member[position]]
    }

    /// The member that owns chunk `index` of the files with this anchor.
    pub fn owner(&self, anchor: u32, index: ChunkIndex) -> &Member {
        self.at(self.placement.owner(anchor, index))
    }

    /// The members that own chunks `first..=last` of the files with this anchor, each once
    /// (see [`Placement::owners_of_chunks`]).
    pub fn owners_of_chunks(&self, anchor: u32, first: ChunkIndex, last: ChunkIndex) -> Vec<&Member> {
        self.placement.owners_of_chunks(anchor, first, last).into_iter().map(|position| self.at(position)).collect()
    }

    /// The member that owns the entry of `path`.
    pub fn owner_of_path(&self, path: &str) -> &Member {
        self.at(self.placement.owner_of_path(path))
    }

    /// The anchor of a file created at `path` (see [`Placement::anchor_of`]).
    pub fn anchor_of(&self, path: &str) -> u32 {
        self.placement.anchor_of(path)
    }

    /// The members in ring order (the order owners are counted in).
    pub fn in_ring_order(&self) -> impl Iterator<Item = &Member> {
        (0..self.ring_to_member.len()).map(|position| self.at(position))
    }

    /// The member at the first position of the ring (fixed, so that all who ask the same
    /// list agree on it).
    pub fn first_in_ring(&self) -> &Member {
        self.at(0)
    }

    /// The next alive member after `name` in ring order.
    pub fn successor_of(&self, name: &str) -> Option<&Member> {
        let size = self.ring_to_member.len();
        let start = self.placement.ring().iter().position(|candidate| candidate == name)?;
        (1..size).map(|step| self.at((start + step) % size)).find(|member| member.alive)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HashFunction, Scheme, describe};

    fn list(names: &[&str]) -> MemberList {
        let members = names
            .iter()
            .map(|name| Member {
                name: name.to_string(),
                tcp_address: format!("{name}:1"),
                unix_path: String::new(),
                host_id: 1,
                pid: 1,
                alive: true,
                incarnation: 1,
            })
            .collect();
        MemberList { epoch: 1, placement: describe(Scheme::Modular, HashFunction::Koyama), members }
    }

    #[test]
    fn owners_are_members_in_ring_order_whatever_the_list_order() {
        let one = MemberRing::new(list(&["a", "b", "c"])).unwrap();
        let other = MemberRing::new(list(&["c", "a", "b"])).unwrap();
        for path in ["/x", "/y/z", "/data/0001"] {
            assert_eq!(one.owner_of_path(path).name, other.owner_of_path(path).name);
            let anchor = one.anchor_of(path);
            assert_eq!(one.owner(anchor, ChunkIndex::FIRST).name, one.owner_of_path(path).name);
            assert_eq!(one.owner(anchor, ChunkIndex(1)).name, other.owner(anchor, ChunkIndex(1)).name);
        }
        assert_eq!(one.first_in_ring().name, other.first_in_ring().name);
    }

    #[test]
    fn a_list_that_names_a_server_twice_or_an_unknown_placement_is_refused() {
        assert!(MemberRing::new(list(&["a", "a"])).is_err());
        let mut odd = list(&["a"]);
        odd.placement = "spiral/koyama".into();
        assert!(MemberRing::new(odd).is_err());
    }
}
