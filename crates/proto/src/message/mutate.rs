//! Seeded mutations of encoded messages, for the protocol fuzzers.
//!
//! Random bytes almost never get past a message's tag, so the fuzzers start from valid
//! encodings ([`super::samples`]) and damage them the way a buggy or hostile peer would:
//! flipped bits, bytes set to edge values (0, 0xFF, 0x7F, 0x80), length fields made huge or
//! off by one, bytes inserted, removed, duplicated or cut off, and pieces spliced from another
//! message. The same seed gives the same inputs, so a failure replays exactly.

/// A small, fast, seeded generator (xorshift64*); not for anything but tests.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }

    pub fn fill(&mut self, bytes: &mut [u8]) {
        for byte in bytes {
            *byte = self.next_u64() as u8;
        }
    }
}

/// Applies 1 to 4 random mutations to `body`; `donor` is another valid encoding to splice from.
pub fn mutate(rng: &mut Rng, body: &mut Vec<u8>, donor: &[u8]) {
    for _ in 0..1 + rng.below(4) {
        mutate_once(rng, body, donor);
    }
}

fn mutate_once(rng: &mut Rng, body: &mut Vec<u8>, donor: &[u8]) {
    let position = |rng: &mut Rng, len: usize| if len == 0 { 0 } else { rng.below(len as u64) as usize };
    match rng.below(9) {
        0 if !body.is_empty() => {
            let at = position(rng, body.len());
            body[at] ^= 1 << rng.below(8);
        }
        1 if !body.is_empty() => {
            let at = position(rng, body.len());
            body[at] = [0x00, 0xFF, 0x7F, 0x80, 0x01][rng.below(5) as usize];
        }
        // A 4-byte little-endian field (most lengths and counts) set to an edge value.
        2 if body.len() >= 4 => {
            let at = position(rng, body.len() - 3);
            let value: u32 = [u32::MAX, u32::MAX / 2, 1 << 24, 1 << 30, 0, 1, 255, 4096][rng.below(8) as usize];
            body[at..at + 4].copy_from_slice(&value.to_le_bytes());
        }
        // An 8-byte field (offsets, sizes, ids, times) set to an edge value.
        3 if body.len() >= 8 => {
            let at = position(rng, body.len() - 7);
            let value: u64 = [u64::MAX, i64::MAX as u64, i64::MIN as u64, 1 << 40, 0, 1][rng.below(6) as usize];
            body[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
        4 => {
            let at = position(rng, body.len() + 1);
            let mut inserted = vec![0u8; 1 + rng.below(8) as usize];
            rng.fill(&mut inserted);
            body.splice(at..at, inserted);
        }
        5 if !body.is_empty() => {
            let at = position(rng, body.len());
            let len = (1 + rng.below(8) as usize).min(body.len() - at);
            body.drain(at..at + len);
        }
        6 if !body.is_empty() => {
            let cut = position(rng, body.len());
            body.truncate(cut);
        }
        7 if !body.is_empty() => {
            let at = position(rng, body.len());
            let len = (1 + rng.below(16) as usize).min(body.len() - at);
            let copy = body[at..at + len].to_vec();
            let to = position(rng, body.len() + 1);
            body.splice(to..to, copy);
        }
        _ if !donor.is_empty() => {
            // Splice: our head with the donor's tail.
            let keep = position(rng, body.len() + 1);
            let from = position(rng, donor.len());
            body.truncate(keep);
            body.extend_from_slice(&donor[from..]);
        }
        _ => body.push(rng.next_u64() as u8),
    }
}
