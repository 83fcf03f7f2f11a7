//! Little-endian primitives that every message is built from.
//!
//! Encoding never fails; decoding checks every length against the bytes that are really there
//! and returns [`DecodeError`] instead of panicking, because message bodies come off the network.

use thiserror::Error;

/// Why a message body could not be decoded. The connection that sent it is closed.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("message ends early: needed {needed} more bytes at offset {offset}")]
    Truncated { offset: usize, needed: usize },
    #[error("unknown message type {0}")]
    UnknownMessage(u8),
    #[error("invalid value {value} for {field}")]
    InvalidValue { field: &'static str, value: u64 },
    #[error("string field is not UTF-8")]
    NotUtf8,
    #[error("{0} bytes left over after the message")]
    TrailingBytes(usize),
}

/// Appends encoded values to a byte vector.
pub struct Writer<'a> {
    bytes: &'a mut Vec<u8>,
}

impl<'a> Writer<'a> {
    pub fn new(bytes: &'a mut Vec<u8>) -> Self {
        Writer { bytes }
    }

    pub fn u8(&mut self, value: u8) -> &mut Self {
        self.bytes.push(value);
        self
    }

    pub fn bool(&mut self, value: bool) -> &mut Self {
        self.u8(value as u8)
    }

    pub fn u16(&mut self, value: u16) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn u32(&mut self, value: u32) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn i32(&mut self, value: i32) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn i64(&mut self, value: i64) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// Bytes of a fixed-size field, without a length.
    pub fn raw(&mut self, value: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(value);
        self
    }

    /// A byte string: u32 length, then the bytes.
    pub fn bytes(&mut self, value: &[u8]) -> &mut Self {
        self.u32(value.len() as u32);
        self.bytes.extend_from_slice(value);
        self
    }

    /// A UTF-8 string, encoded like [`Writer::bytes`].
    pub fn str(&mut self, value: &str) -> &mut Self {
        self.bytes(value.as_bytes())
    }

    /// An optional value: a presence byte (0 or 1), then the value if present.
    pub fn option<T>(&mut self, value: Option<&T>, mut write: impl FnMut(&mut Self, &T)) -> &mut Self
    where
        T: ?Sized,
    {
        match value {
            Some(value) => {
                self.u8(1);
                write(self, value);
            }
            None => {
                self.u8(0);
            }
        }
        self
    }
}

/// Reads encoded values from a byte slice, front to back.
pub struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, offset: 0 }
    }

    fn take(&mut self, count: usize) -> Result<&'a [u8], DecodeError> {
        let available = self.bytes.len() - self.offset;
        if count > available {
            return Err(DecodeError::Truncated { offset: self.offset, needed: count - available });
        }
        let slice = &self.bytes[self.offset..self.offset + count];
        self.offset += count;
        Ok(slice)
    }

    /// A fixed-size field written with [`Writer::raw`].
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::InvalidValue { field: "bool", value: other as u64 }),
        }
    }

    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let length = self.u32()? as usize;
        self.take(length)
    }

    pub fn string(&mut self) -> Result<String, DecodeError> {
        let bytes = self.bytes()?;
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|_| DecodeError::NotUtf8)
    }

    pub fn option<T>(&mut self, read: impl FnOnce(&mut Self) -> Result<T, DecodeError>) -> Result<Option<T>, DecodeError> {
        if self.bool()? { Ok(Some(read(self)?)) } else { Ok(None) }
    }

    /// A count of items that follow, checked against the bytes left so that a forged count
    /// cannot make the decoder reserve a huge vector.
    pub fn count(&mut self, min_item_bytes: usize) -> Result<usize, DecodeError> {
        let count = self.u32()? as usize;
        let left = self.bytes.len() - self.offset;
        if count.saturating_mul(min_item_bytes.max(1)) > left {
            return Err(DecodeError::InvalidValue { field: "count", value: count as u64 });
        }
        Ok(count)
    }

    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.bytes.len() - self.offset {
            0 => Ok(()),
            left => Err(DecodeError::TrailingBytes(left)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let mut buffer = Vec::new();
        Writer::new(&mut buffer).u8(7).u16(300).u32(70_000).i32(-5).u64(1 << 40).i64(-9).str("héllo").bool(true);
        let mut reader = Reader::new(&buffer);
        assert_eq!(reader.u8(), Ok(7));
        assert_eq!(reader.u16(), Ok(300));
        assert_eq!(reader.u32(), Ok(70_000));
        assert_eq!(reader.i32(), Ok(-5));
        assert_eq!(reader.u64(), Ok(1 << 40));
        assert_eq!(reader.i64(), Ok(-9));
        assert_eq!(reader.string().as_deref(), Ok("héllo"));
        assert_eq!(reader.bool(), Ok(true));
        assert_eq!(reader.finish(), Ok(()));
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        let mut reader = Reader::new(&[1, 0]);
        assert_eq!(reader.u32(), Err(DecodeError::Truncated { offset: 0, needed: 2 }));
        let mut reader = Reader::new(&[255, 255, 255, 255, b'a']);
        assert!(matches!(reader.string(), Err(DecodeError::Truncated { .. })));
    }

    #[test]
    fn forged_counts_are_rejected() {
        let mut buffer = Vec::new();
        Writer::new(&mut buffer).u32(u32::MAX);
        assert!(Reader::new(&buffer).count(8).is_err());
    }
}
