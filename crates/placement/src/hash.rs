//! The stable hash functions that place keys on servers.
//!
//! Placement must not change between builds, machines or runs, so the hashes are specified
//! bit for bit here and pinned by golden test vectors (cross-checked against the reference
//! `mmh3` implementation of MurmurHash3). Neither hash depends on the platform's endianness.

use std::fmt;
use std::str::FromStr;

/// A stable 32-bit hash of a byte string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HashFunction {
    /// Sum of the bytes, where each maximal run of ASCII digits adds its decimal value instead
    /// of its bytes (CHFS's default). Numbered names like `file.0001`, `file.0002` land on
    /// consecutive servers, which balances benchmark-style workloads perfectly.
    #[default]
    Koyama,
    /// MurmurHash3 x86_32 with seed [`MURMUR3_SEED`]: good dispersion for arbitrary names.
    Murmur3,
}

/// Seed used with MurmurHash3 (the value CHFS uses).
pub const MURMUR3_SEED: u32 = 1234;

impl HashFunction {
    pub fn hash(self, bytes: &[u8]) -> u32 {
        match self {
            HashFunction::Koyama => koyama(bytes),
            HashFunction::Murmur3 => murmur3_x86_32(bytes, MURMUR3_SEED),
        }
    }
}

impl fmt::Display for HashFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HashFunction::Koyama => "koyama",
            HashFunction::Murmur3 => "murmur3",
        })
    }
}

impl FromStr for HashFunction {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "koyama" => Ok(HashFunction::Koyama),
            "murmur3" => Ok(HashFunction::Murmur3),
            other => Err(format!("unknown hash function {other:?} (expected koyama or murmur3)")),
        }
    }
}

/// The koyama hash: bytes are added as unsigned values (wrapping at 2^32), except that a
/// maximal run of ASCII digits adds the number it spells (accumulated with wrapping
/// arithmetic). `"abc12300"` hashes to 97 + 98 + 99 + 12300.
///
/// CHFS reads bytes as C `char`, which is signed on x86, so bytes >= 0x80 differ there; ringfs
/// defines them as unsigned.
pub fn koyama(bytes: &[u8]) -> u32 {
    let mut sum: u32 = 0;
    let mut position = 0;
    while position < bytes.len() {
        let byte = bytes[position];
        if byte.is_ascii_digit() {
            let mut number: u32 = 0;
            while position < bytes.len() && bytes[position].is_ascii_digit() {
                number = number.wrapping_mul(10).wrapping_add((bytes[position] - b'0') as u32);
                position += 1;
            }
            sum = sum.wrapping_add(number);
        } else {
            sum = sum.wrapping_add(byte as u32);
            position += 1;
        }
    }
    sum
}

/// MurmurHash3, x86 32-bit variant (Austin Appleby's public-domain algorithm), reading blocks
/// as little-endian words.
pub fn murmur3_x86_32(bytes: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mix = |mut k: u32| {
        k = k.wrapping_mul(C1);
        k = k.rotate_left(15);
        k.wrapping_mul(C2)
    };
    let mut h = seed;
    let mut blocks = bytes.chunks_exact(4);
    for block in &mut blocks {
        let k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        h ^= mix(k);
        h = h.rotate_left(13);
        h = h.wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let mut k: u32 = 0;
        for (shift, byte) in tail.iter().enumerate() {
            k |= (*byte as u32) << (8 * shift);
        }
        h ^= mix(k);
    }
    h ^= bytes.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Golden vectors: computed with the reference implementation (Python `mmh3.hash(s, seed,
    /// signed=False)`). If one of these changes, every ringfs placement changes.
    #[test]
    fn murmur3_matches_golden_vectors() {
        let vectors: [(&[u8], u32, u32); 6] = [
            (b"", 254_590_987, 0),
            (b"a", 1_374_314_456, 1_009_084_850),
            (b"abc", 3_861_251_110, 3_017_643_002),
            (b"hello", 2_251_423_591, 613_153_351),
            (b"/data/file.00000001", 4_213_078_449, 1_528_176_706),
            (b"The quick brown fox jumps over the lazy dog", 662_953_101, 776_992_547),
        ];
        for (input, with_seed_1234, with_seed_0) in vectors {
            assert_eq!(murmur3_x86_32(input, 1234), with_seed_1234, "seed 1234, {input:?}");
            assert_eq!(murmur3_x86_32(input, 0), with_seed_0, "seed 0, {input:?}");
        }
        assert_eq!(HashFunction::Murmur3.hash(b"abc"), 3_861_251_110);
    }

    /// Golden vectors for koyama, including the examples of the CHFS source.
    #[test]
    fn koyama_matches_golden_vectors() {
        assert_eq!(koyama(b""), 0);
        assert_eq!(koyama(b"a"), 97);
        assert_eq!(koyama(b"abc"), 294);
        assert_eq!(koyama(b"abc12300"), 294 + 12300);
        assert_eq!(koyama(b"abc1230\x003"), 294 + 1230 + 3);
        assert_eq!(koyama(b"/d/file.00000001"), 47 + 100 + 47 + 102 + 105 + 108 + 101 + 46 + 1);
        assert_eq!(koyama(b"/d/file.00000002"), koyama(b"/d/file.00000001") + 1);
        // A 20-digit run wraps modulo 2^32.
        assert_eq!(koyama(b"99999999999999999999"), 99_999_999_999_999_999_999u128 as u32);
        assert_eq!(koyama(&[0xff]), 255);
    }

    #[test]
    fn hash_functions_parse_from_their_names() {
        for function in [HashFunction::Koyama, HashFunction::Murmur3] {
            assert_eq!(function.to_string().parse::<HashFunction>(), Ok(function));
        }
        assert!("md5".parse::<HashFunction>().is_err());
    }
}
