//! The configuration words every ringfs component shares, written once: the names of the
//! environment variables ([`env`]) and byte sizes as people write them ([`ByteSize`]).
//!
//! Libraries take their settings as values (a `Config` struct per component); only the
//! edges — the command line, the C and preload libraries, the Python binding, a rank of the
//! global memory — read the environment, and they name the variables through [`env`], so
//! that what `ringfs start` exports and what a client reads cannot drift apart.
//!
//! ```
//! use ringfs_config::{ByteSize, env};
//! let size: ByteSize = "4MiB".parse().unwrap();
//! assert_eq!(size.bytes(), 4 << 20);
//! assert_eq!(size.to_string(), "4M");
//! assert_eq!(env::SERVER, "RINGFS_SERVER");
//! ```

pub mod env;

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// A number of bytes: `65536`, `64K`, `64k`, `1M`, `4MiB`, `2 GB`, `1T` — a decimal number
/// and an optional unit (K, M, G, T: powers of 1024), case-insensitive, with an optional `B`
/// or `iB` after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

/// Why a text is not a [`ByteSize`].
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ByteSizeError {
    #[error("invalid size {0:?}: expected a number with an optional K, M, G or T (powers of 1024)")]
    Invalid(String),
    #[error("size {0:?} is too large")]
    TooLarge(String),
}

impl ByteSize {
    pub fn bytes(self) -> u64 {
        self.0
    }

    /// The size as a `u32` (a chunk or block size), if it fits.
    pub fn as_u32(self) -> Option<u32> {
        u32::try_from(self.0).ok()
    }
}

impl FromStr for ByteSize {
    type Err = ByteSizeError;

    fn from_str(text: &str) -> Result<ByteSize, ByteSizeError> {
        let trimmed = text.trim();
        let digits_end = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
        let number: u64 = trimmed[..digits_end].parse().map_err(|_| ByteSizeError::Invalid(text.to_string()))?;
        let unit = trimmed[digits_end..].trim().to_ascii_uppercase();
        let unit = unit.strip_suffix("IB").or_else(|| unit.strip_suffix('B')).unwrap_or(&unit);
        let shift = match unit {
            "" => 0,
            "K" => 10,
            "M" => 20,
            "G" => 30,
            "T" => 40,
            _ => return Err(ByteSizeError::Invalid(text.to_string())),
        };
        number.checked_mul(1 << shift).map(ByteSize).ok_or_else(|| ByteSizeError::TooLarge(text.to_string()))
    }
}

impl fmt::Display for ByteSize {
    /// The largest unit that divides the size exactly (`1M`, `64K`, `1000`).
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [(40, "T"), (30, "G"), (20, "M"), (10, "K")];
        match units.iter().find(|(shift, _)| self.0 != 0 && self.0.is_multiple_of(1 << shift)) {
            Some((shift, unit)) => write!(formatter, "{}{unit}", self.0 >> shift),
            None => write!(formatter, "{}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_people_write_them() {
        for (text, bytes) in [
            ("65536", 65536),
            ("64K", 64 << 10),
            ("64k", 64 << 10),
            ("1M", 1 << 20),
            ("4MiB", 4 << 20),
            ("4mb", 4 << 20),
            ("2 GB", 2 << 30),
            ("1T", 1 << 40),
            ("0", 0),
            (" 512B ", 512),
        ] {
            assert_eq!(text.parse::<ByteSize>(), Ok(ByteSize(bytes)), "{text}");
        }
        for text in ["", "K", "1.5M", "1X", "-1", "1MM", "1 M B"] {
            assert!(text.parse::<ByteSize>().is_err(), "{text}");
        }
        assert!(matches!("99999999999T".parse::<ByteSize>(), Err(ByteSizeError::TooLarge(_))));
    }

    #[test]
    fn a_size_prints_in_the_largest_exact_unit_and_parses_back() {
        for bytes in [0, 1, 1000, 1024, 3 << 20, (1 << 30) + 1, 5 << 40] {
            let size = ByteSize(bytes);
            assert_eq!(size.to_string().parse::<ByteSize>(), Ok(size));
        }
        assert_eq!(ByteSize(1 << 20).to_string(), "1M");
        assert_eq!(ByteSize(1536).to_string(), "1536");
    }
}
