//! The frame: the unit that travels on a connection.
//!
//! ```text
//! offset  size  field
//!      0     4  body_len    length of the encoded message body (u32, little-endian)
//!      4     4  data_len    length of the raw data section after the body (u32)
//!      8     8  request_id  chosen by the requester; the response carries the same id (u64)
//!     16     8  epoch       sender's membership epoch (u64)
//!     24     …  body        one encoded Request or Response
//!      …     …  data        raw bytes (chunk contents), never re-encoded
//! ```
//!
//! Bulk bytes travel in the data section so that neither side has to copy them through the
//! message codec. Limits are checked on the header, before any body byte is read, so an
//! oversized frame costs the receiver nothing but closing the connection.

use thiserror::Error;

/// Size of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 24;
/// Largest message body a peer accepts (directory pages, member lists, paths).
pub const MAX_BODY_LEN: u32 = 4 << 20;
/// Largest data section a peer accepts: one chunk of the largest allowed chunk size.
pub const MAX_DATA_LEN: u32 = 64 << 20;

/// The fixed part of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FrameHeader {
    pub body_len: u32,
    pub data_len: u32,
    pub request_id: u64,
    pub epoch: u64,
}

/// A header whose lengths break the limits; the receiver closes the connection.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame body of {0} bytes exceeds the limit of {MAX_BODY_LEN}")]
    BodyTooLarge(u32),
    #[error("frame data of {0} bytes exceeds the limit of {MAX_DATA_LEN}")]
    DataTooLarge(u32),
    #[error("empty frame body")]
    EmptyBody,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut bytes = [0u8; HEADER_LEN];
        bytes[0..4].copy_from_slice(&self.body_len.to_le_bytes());
        bytes[4..8].copy_from_slice(&self.data_len.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.epoch.to_le_bytes());
        bytes
    }

    /// Decodes and checks a header against [`MAX_BODY_LEN`] and [`MAX_DATA_LEN`].
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Result<FrameHeader, FrameError> {
        let word = |range: std::ops::Range<usize>| {
            let mut array = [0u8; 4];
            array.copy_from_slice(&bytes[range]);
            u32::from_le_bytes(array)
        };
        let long = |range: std::ops::Range<usize>| {
            let mut array = [0u8; 8];
            array.copy_from_slice(&bytes[range]);
            u64::from_le_bytes(array)
        };
        let header = FrameHeader { body_len: word(0..4), data_len: word(4..8), request_id: long(8..16), epoch: long(16..24) };
        if header.body_len == 0 {
            return Err(FrameError::EmptyBody);
        }
        if header.body_len > MAX_BODY_LEN {
            return Err(FrameError::BodyTooLarge(header.body_len));
        }
        if header.data_len > MAX_DATA_LEN {
            return Err(FrameError::DataTooLarge(header.data_len));
        }
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let header = FrameHeader { body_len: 10, data_len: 1 << 20, request_id: 77, epoch: 3 };
        assert_eq!(FrameHeader::decode(&header.encode()), Ok(header));
    }

    #[test]
    fn oversized_frames_are_refused_before_reading_them() {
        let header = FrameHeader { body_len: MAX_BODY_LEN + 1, ..Default::default() };
        assert_eq!(FrameHeader::decode(&header.encode()), Err(FrameError::BodyTooLarge(MAX_BODY_LEN + 1)));
        let header = FrameHeader { body_len: 1, data_len: MAX_DATA_LEN + 1, ..Default::default() };
        assert!(matches!(FrameHeader::decode(&header.encode()), Err(FrameError::DataTooLarge(_))));
        let header = FrameHeader::default();
        assert_eq!(FrameHeader::decode(&header.encode()), Err(FrameError::EmptyBody));
    }
}
