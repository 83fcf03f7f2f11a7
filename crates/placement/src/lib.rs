//! Which server owns which key.
//!
//! Two kinds of keys are placed: the *entry* of a path (a name), and chunk *i* of a file. A
//! file is placed by its *anchor* — the placement hash of the path it was created at, kept in
//! its id — so chunk 0 of a new file lands on the server of its name, and chunk *i* of a file
//! stays where it is whatever the file is renamed to. Servers are ordered in a *ring* by the
//! hash of their names (ties broken by the name itself), so every client and server that knows
//! the same set of names computes the same owner for every key, with no directory service.
//!
//! Two schemes are offered ([`Scheme`]):
//! - **modular** (default, as CHFS): the anchor of a path is `H(path)`, and chunk *i* of a
//!   file with anchor *a* lives on `ring[(a + i) mod n]`: chunk 0 lands on a hashed server and
//!   chunk *i* on the *i*-th next one, which stripes every large file over all servers.
//! - **consistent**: the anchor is `H(path \0 0)`, placed on a ring of points (each server owns
//!   `virtual_nodes` points); chunk *i* > 0 is placed by `H(anchor \0 i)`. A change of
//!   membership moves only the keys of the servers that joined or left.
//!
//! `H` is one of the stable [`HashFunction`]s. This crate knows nothing about the network; the
//! client and the server both use it with their current member list ([`MemberRing`]: a
//! member list with its ring, the owner of every key as a member).
//!
//! ```
//! use ringfs_placement::{HashFunction, Placement, Scheme};
//! use ringfs_proto::ChunkIndex;
//! let names = ["node-a".to_string(), "node-b".to_string(), "node-c".to_string()];
//! let placement = Placement::new(names, HashFunction::Koyama, Scheme::Modular).unwrap();
//! let anchor = placement.anchor_of("/data/checkpoint");
//! let first = placement.owner(anchor, ChunkIndex::FIRST);
//! assert_eq!(first, placement.owner_of_path("/data/checkpoint"));
//! assert_eq!(placement.owner(anchor, ChunkIndex(1)), (first + 1) % 3);
//! ```

pub mod hash;
mod members;

pub use hash::HashFunction;
pub use members::MemberRing;

use ringfs_proto::ChunkIndex;
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// How keys are mapped onto the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Scheme {
    #[default]
    Modular,
    Consistent {
        virtual_nodes: u32,
    },
}

/// Virtual nodes per server when consistent hashing is chosen without a count.
pub const DEFAULT_VIRTUAL_NODES: u32 = 64;

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scheme::Modular => f.write_str("modular"),
            Scheme::Consistent { virtual_nodes } => write!(f, "consistent:{virtual_nodes}"),
        }
    }
}

impl FromStr for Scheme {
    type Err = String;

    /// `modular`, `consistent` or `consistent:<virtual nodes per server>`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once(':') {
            None if text == "modular" => Ok(Scheme::Modular),
            None if text == "consistent" => Ok(Scheme::Consistent { virtual_nodes: DEFAULT_VIRTUAL_NODES }),
            Some(("consistent", count)) => match count.parse::<u32>() {
                Ok(virtual_nodes) if virtual_nodes > 0 => Ok(Scheme::Consistent { virtual_nodes }),
                _ => Err(format!("invalid virtual node count {count:?}")),
            },
            _ => Err(format!("unknown placement {text:?} (expected modular or consistent[:N])")),
        }
    }
}

/// The textual form `<scheme>/<hash>` servers announce in their member list.
pub fn describe(scheme: Scheme, hash: HashFunction) -> String {
    format!("{scheme}/{hash}")
}

/// Parses the form written by [`describe`].
pub fn parse_description(text: &str) -> Result<(Scheme, HashFunction), String> {
    let (scheme, hash) = text.split_once('/').ok_or_else(|| format!("invalid placement description {text:?}"))?;
    Ok((scheme.parse()?, hash.parse()?))
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PlacementError {
    #[error("a placement needs at least one server")]
    NoServers,
    #[error("server name {0:?} appears twice")]
    DuplicateName(String),
}

/// The ring of servers and the rule that maps keys onto it.
#[derive(Clone, Debug)]
pub struct Placement {
    hash: HashFunction,
    scheme: Scheme,
    /// Server names in ring order.
    ring: Vec<String>,
    /// Consistent hashing only: (point hash, ring position), sorted by hash.
    points: Vec<(u32, usize)>,
}

impl Placement {
    /// Builds the ring from server names (in any order).
    pub fn new(names: impl IntoIterator<Item = String>, hash: HashFunction, scheme: Scheme) -> Result<Placement, PlacementError> {
        let mut ring: Vec<String> = names.into_iter().collect();
        if ring.is_empty() {
            return Err(PlacementError::NoServers);
        }
        ring.sort_by(|a, b| hash.hash(a.as_bytes()).cmp(&hash.hash(b.as_bytes())).then_with(|| a.cmp(b)));
        if let Some(pair) = ring.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(PlacementError::DuplicateName(pair[0].clone()));
        }
        let points = match scheme {
            Scheme::Modular => Vec::new(),
            Scheme::Consistent { virtual_nodes } => {
                let mut points = Vec::with_capacity(ring.len() * virtual_nodes as usize);
                for (position, name) in ring.iter().enumerate() {
                    for node in 0..virtual_nodes {
                        let point =
                            if virtual_nodes == 1 { hash.hash(name.as_bytes()) } else { hash.hash(format!("{name}#{node}").as_bytes()) };
                        points.push((point, position));
                    }
                }
                points.sort_unstable();
                points
            }
        };
        Ok(Placement { hash, scheme, ring, points })
    }

    /// Server names in ring order; [`Placement::owner`] returns positions in this slice.
    pub fn ring(&self) -> &[String] {
        &self.ring
    }

    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    pub fn hash_function(&self) -> HashFunction {
        self.hash
    }

    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The anchor of a file created at `path`: [`Placement::owner`]`(anchor, 0)` is the owner of
    /// the path's entry.
    pub fn anchor_of(&self, path: &str) -> u32 {
        match self.scheme {
            Scheme::Modular => self.hash.hash(path.as_bytes()),
            Scheme::Consistent { .. } => self.hash.hash(&consistent_key(path.as_bytes(), 0)),
        }
    }

    /// Ring position of the server that owns the entry of `path`.
    pub fn owner_of_path(&self, path: &str) -> usize {
        self.owner(self.anchor_of(path), ChunkIndex::FIRST)
    }

    /// Ring position of the server that owns chunk `index` of the file with this anchor.
    pub fn owner(&self, anchor: u32, index: ChunkIndex) -> usize {
        // Placement is where an index stops being a position in a file and becomes a number
        // to hash.
        let index = index.0;
        match self.scheme {
            Scheme::Modular => {
                // (anchor + index) mod n, without overflow for any index a request may name.
                let servers = self.ring.len() as u64;
                ((anchor as u64 % servers + index % servers) % servers) as usize
            }
            Scheme::Consistent { .. } => {
                let point = if index == 0 { anchor } else { self.hash.hash(&consistent_key(&anchor.to_le_bytes(), index)) };
                let slot = self.points.partition_point(|(candidate, _)| *candidate < point);
                self.points[slot % self.points.len()].1
            }
        }
    }

    /// Ring positions of the servers that own chunks `first..=last` of the file with this
    /// anchor, each once, in the order of the chunks. Past a few chunks per server every
    /// server owns some (under consistent hashing, almost surely): then all positions,
    /// without computing the owner of each chunk of a large file.
    pub fn owners_of_chunks(&self, anchor: u32, first: ChunkIndex, last: ChunkIndex) -> Vec<usize> {
        /// Chunks per server past which consistent hashing counts as reaching every server
        /// (missing one then has a chance of e^-4 per server; asking it anyway is harmless).
        const CHUNKS_PER_SERVER: u64 = 4;
        let servers = self.ring.len() as u64;
        let chunks = first.count_through(last);
        let every = match self.scheme {
            Scheme::Modular => chunks >= servers,
            Scheme::Consistent { .. } => chunks >= servers.saturating_mul(CHUNKS_PER_SERVER),
        };
        if every {
            return (0..self.ring.len()).collect();
        }
        let mut seen = vec![false; self.ring.len()];
        first
            .through(last)
            .map(|index| self.owner(anchor, index))
            .filter(|&position| !std::mem::replace(&mut seen[position], true))
            .collect()
    }

    /// Ring position of the server called `name`, if it is in the ring.
    pub fn position_of(&self, name: &str) -> Option<usize> {
        self.ring.iter().position(|candidate| candidate == name)
    }
}

/// The bytes hashed for a key under consistent hashing: the path (or an anchor's bytes), a
/// NUL, the index in decimal.
fn consistent_key(base: &[u8], index: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(base.len() + 21);
    key.extend_from_slice(base);
    key.push(0);
    key.extend_from_slice(index.to_string().as_bytes());
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(count: usize) -> Vec<String> {
        (0..count).map(|i| format!("server-{i}")).collect()
    }

    #[test]
    fn ring_is_ordered_by_name_hash() {
        let placement = Placement::new(names(4), HashFunction::Murmur3, Scheme::Modular).unwrap();
        let hashes: Vec<u32> = placement.ring().iter().map(|n| HashFunction::Murmur3.hash(n.as_bytes())).collect();
        assert!(hashes.windows(2).all(|pair| pair[0] <= pair[1]));
        // The input order does not matter.
        let mut reversed = names(4);
        reversed.reverse();
        let again = Placement::new(reversed, HashFunction::Murmur3, Scheme::Modular).unwrap();
        assert_eq!(placement.ring(), again.ring());
    }

    /// Golden placement: with koyama, "server-0".."server-3" hash to consecutive sums, so the
    /// ring is in numeric order and numbered files go round-robin.
    #[test]
    fn modular_koyama_places_numbered_files_round_robin() {
        let placement = Placement::new(names(4), HashFunction::Koyama, Scheme::Modular).unwrap();
        assert_eq!(placement.ring(), names(4).as_slice());
        let owners: Vec<usize> = (0..8).map(|i| placement.owner_of_path(&format!("/d/f.{i:04}"))).collect();
        let first = owners[0];
        assert_eq!(owners, (0..8).map(|i| (first + i) % 4).collect::<Vec<_>>());
        // koyama("/d/f.0000") = 47+100+47+102+46 = 342; 342 % 4 = 2.
        assert_eq!(first, 2);
    }

    #[test]
    fn empty_and_duplicate_rings_are_refused() {
        assert_eq!(Placement::new(Vec::new(), HashFunction::Koyama, Scheme::Modular).unwrap_err(), PlacementError::NoServers);
        let duplicate = vec!["a".to_string(), "a".to_string()];
        assert!(matches!(Placement::new(duplicate, HashFunction::Koyama, Scheme::Modular), Err(PlacementError::DuplicateName(_))));
    }

    #[test]
    fn schemes_parse() {
        assert_eq!("modular".parse(), Ok(Scheme::Modular));
        assert_eq!("consistent".parse(), Ok(Scheme::Consistent { virtual_nodes: DEFAULT_VIRTUAL_NODES }));
        assert_eq!("consistent:8".parse(), Ok(Scheme::Consistent { virtual_nodes: 8 }));
        assert!("consistent:0".parse::<Scheme>().is_err());
        assert!("ring".parse::<Scheme>().is_err());
    }

    #[test]
    fn descriptions_round_trip() {
        for scheme in [Scheme::Modular, Scheme::Consistent { virtual_nodes: 5 }] {
            for hash in [HashFunction::Koyama, HashFunction::Murmur3] {
                assert_eq!(parse_description(&describe(scheme, hash)), Ok((scheme, hash)));
            }
        }
        assert!(parse_description("modular").is_err());
    }

    #[test]
    fn consistent_hashing_spreads_keys_over_all_servers() {
        let placement = Placement::new(names(4), HashFunction::Murmur3, Scheme::Consistent { virtual_nodes: 64 }).unwrap();
        let mut counts = [0usize; 4];
        for file in 0..4000 {
            counts[placement.owner_of_path(&format!("/data/{file}"))] += 1;
        }
        assert!(counts.iter().all(|&count| count > 600), "unbalanced: {counts:?}");
    }

    proptest! {
        #[test]
        fn owners_are_valid_positions(path in "/[a-z0-9/._]{0,30}", index in any::<u64>(), servers in 1usize..9) {
            for scheme in [Scheme::Modular, Scheme::Consistent { virtual_nodes: 3 }] {
                let placement = Placement::new(names(servers), HashFunction::Murmur3, scheme).unwrap();
                let anchor = placement.anchor_of(&path);
                prop_assert!(placement.owner(anchor, ChunkIndex(index)) < servers);
            }
        }

        #[test]
        fn modular_placement_stripes_consecutive_chunks(path in "/[a-z0-9]{1,20}", index in 0u64..1_000_000, servers in 1usize..9) {
            let placement = Placement::new(names(servers), HashFunction::Koyama, Scheme::Modular).unwrap();
            let anchor = placement.anchor_of(&path);
            prop_assert_eq!(placement.owner(anchor, ChunkIndex(index + 1)), (placement.owner(anchor, ChunkIndex(index)) + 1) % servers);
        }

        /// The owners of a range of chunks include the owner of every chunk in it, once each.
        #[test]
        fn owners_of_chunks_cover_every_chunk_of_the_range(
            path in "/[a-z0-9]{1,20}", first in 1u64..50, count in 0u64..80, servers in 1usize..12
        ) {
            for scheme in [Scheme::Modular, Scheme::Consistent { virtual_nodes: 3 }] {
                let placement = Placement::new(names(servers), HashFunction::Murmur3, scheme).unwrap();
                let anchor = placement.anchor_of(&path);
                let (first, last) = (ChunkIndex(first), ChunkIndex(first + count));
                let owners = placement.owners_of_chunks(anchor, first, last);
                for index in first.through(last) {
                    prop_assert!(owners.contains(&placement.owner(anchor, index)));
                }
                let mut once = owners.clone();
                once.sort_unstable();
                once.dedup();
                prop_assert_eq!(once.len(), owners.len());
                // A few chunks ask a few servers, not all.
                if count + 1 < servers as u64 {
                    prop_assert!(owners.len() <= count as usize + 1);
                }
            }
        }

        /// Removing one server moves only the keys that it owned.
        #[test]
        fn consistent_hashing_moves_only_keys_of_a_removed_server(removed in 0usize..5, keys in proptest::collection::vec("/[a-z]{1,12}", 1..50)) {
            let all = Placement::new(names(5), HashFunction::Murmur3, Scheme::Consistent { virtual_nodes: 16 }).unwrap();
            let removed_name = all.ring()[removed].clone();
            let rest = Placement::new(names(5).into_iter().filter(|n| *n != removed_name), HashFunction::Murmur3, Scheme::Consistent { virtual_nodes: 16 }).unwrap();
            for key in keys {
                let before = &all.ring()[all.owner_of_path(&key)];
                let after = &rest.ring()[rest.owner_of_path(&key)];
                if *before != removed_name {
                    prop_assert_eq!(before, after);
                }
            }
        }
    }
}
