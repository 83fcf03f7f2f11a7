//! The active-message headers of the frame transport, and their checks.
//!
//! ```text
//! request header (message REQUEST)          response header (message RESPONSE)
//!  0  24  ringfs FrameHeader                  0  24  ringfs FrameHeader
//! 24   1  flags: 1 source, 2 destination,    24   1  1: the data was put into the
//!            4 send the reply eagerly
//!  …      source descriptor, if flagged                destination, 0: it is in the payload
//!  …      destination descriptor, if flagged
//!
//! descriptor: address u64, length u64, key length u16, packed remote key
//! payload: the frame body, then the data section unless it moves by RMA
//! ```
//!
//! The *source* is the client's write data, which the server reads with `get`; the
//! *destination* is the client's read buffer, which the server may fill with `put`. All
//! integers are little-endian, as in the rest of the ringfs protocol. `ringfs-rpc` speaks the
//! same headers when it carries ringfs connections over UCX.

use ringfs_proto::{FrameHeader, HEADER_LEN, MAX_DATA_LEN};

use crate::Error;
use crate::memory::MAX_PACKED_KEY;

const HAS_SOURCE: u8 = 1;
const HAS_DESTINATION: u8 = 2;
const EAGER_REPLY: u8 = 4;

/// Client memory the server may access by RMA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub address: u64,
    pub length: u64,
    pub key: Vec<u8>,
}

/// A decoded request header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub frame: FrameHeader,
    pub source: Option<Descriptor>,
    pub destination: Option<Descriptor>,
    /// Send the response eagerly, however large (UCX's rendezvous protocol would move its data
    /// by RMA, which the client found emulated on its transports).
    pub eager_reply: bool,
}

impl RequestHeader {
    pub fn encode(&self, bytes: &mut Vec<u8>) {
        bytes.clear();
        bytes.extend_from_slice(&self.frame.encode());
        let flags = if self.source.is_some() { HAS_SOURCE } else { 0 }
            | if self.destination.is_some() { HAS_DESTINATION } else { 0 }
            | if self.eager_reply { EAGER_REPLY } else { 0 };
        bytes.push(flags);
        for descriptor in [&self.source, &self.destination].into_iter().flatten() {
            bytes.extend_from_slice(&descriptor.address.to_le_bytes());
            bytes.extend_from_slice(&descriptor.length.to_le_bytes());
            bytes.extend_from_slice(&(descriptor.key.len() as u16).to_le_bytes());
            bytes.extend_from_slice(&descriptor.key);
        }
    }

    /// Decodes and checks a request header against the payload length that came with it.
    pub fn decode(bytes: &[u8], payload_length: usize) -> Result<RequestHeader, Error> {
        let mut reader = Reader { bytes, position: 0 };
        let frame = reader.frame()?;
        let flags = reader.take(1)?[0];
        if flags & !(HAS_SOURCE | HAS_DESTINATION | EAGER_REPLY) != 0 {
            return Err(Error::Protocol(format!("unknown request flags {flags:#x}")));
        }
        let source = if flags & HAS_SOURCE != 0 { Some(reader.descriptor()?) } else { None };
        let destination = if flags & HAS_DESTINATION != 0 { Some(reader.descriptor()?) } else { None };
        reader.finish()?;
        let inline_data = match &source {
            Some(source) if source.length != frame.data_len as u64 => {
                return Err(Error::Protocol(format!("a source of {} bytes for a data section of {}", source.length, frame.data_len)));
            }
            Some(_) => 0,
            None => frame.data_len as usize,
        };
        check_payload(&frame, inline_data, payload_length)?;
        Ok(RequestHeader { frame, source, destination, eager_reply: flags & EAGER_REPLY != 0 })
    }

    /// Bytes of the data section that travel inside the message.
    pub fn inline_data(&self) -> usize {
        if self.source.is_some() { 0 } else { self.frame.data_len as usize }
    }
}

/// A decoded response header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseHeader {
    pub frame: FrameHeader,
    /// The data section went into the request's destination by RMA.
    pub placed: bool,
}

impl ResponseHeader {
    pub fn encode(&self, bytes: &mut Vec<u8>) {
        bytes.clear();
        bytes.extend_from_slice(&self.frame.encode());
        bytes.push(self.placed as u8);
    }

    pub fn decode(bytes: &[u8], payload_length: usize) -> Result<ResponseHeader, Error> {
        let mut reader = Reader { bytes, position: 0 };
        let frame = reader.frame()?;
        let placed = match reader.take(1)?[0] {
            0 => false,
            1 => true,
            other => return Err(Error::Protocol(format!("invalid placed flag {other}"))),
        };
        reader.finish()?;
        check_payload(&frame, if placed { 0 } else { frame.data_len as usize }, payload_length)?;
        Ok(ResponseHeader { frame, placed })
    }

    /// Bytes of the data section that travel inside the message.
    pub fn inline_data(&self) -> usize {
        if self.placed { 0 } else { self.frame.data_len as usize }
    }
}

fn check_payload(frame: &FrameHeader, inline_data: usize, payload_length: usize) -> Result<(), Error> {
    let expected = frame.body_len as usize + inline_data;
    if payload_length != expected {
        return Err(Error::Protocol(format!("a payload of {payload_length} bytes where the header announces {expected}")));
    }
    Ok(())
}

struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], Error> {
        let end = self.position.checked_add(count).filter(|end| *end <= self.bytes.len());
        let end = end.ok_or_else(|| Error::Protocol(format!("a header of {} bytes ends early", self.bytes.len())))?;
        let taken = &self.bytes[self.position..end];
        self.position = end;
        Ok(taken)
    }

    fn u64(&mut self) -> Result<u64, Error> {
        let mut array = [0u8; 8];
        array.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(array))
    }

    fn frame(&mut self) -> Result<FrameHeader, Error> {
        let mut array = [0u8; HEADER_LEN];
        array.copy_from_slice(self.take(HEADER_LEN)?);
        FrameHeader::decode(&array).map_err(|error| Error::Protocol(error.to_string()))
    }

    fn descriptor(&mut self) -> Result<Descriptor, Error> {
        let address = self.u64()?;
        let length = self.u64()?;
        if length == 0 || length > MAX_DATA_LEN as u64 || address.checked_add(length).is_none() {
            return Err(Error::Protocol(format!("an RMA descriptor of {length} bytes at {address:#x}")));
        }
        let key_length = u16::from_le_bytes([self.take(1)?[0], self.take(1)?[0]]) as usize;
        if key_length == 0 || key_length > MAX_PACKED_KEY {
            return Err(Error::Protocol(format!("a packed remote key of {key_length} bytes")));
        }
        Ok(Descriptor { address, length, key: self.take(key_length)?.to_vec() })
    }

    fn finish(&self) -> Result<(), Error> {
        if self.position != self.bytes.len() {
            return Err(Error::Protocol(format!("{} unexpected bytes after the header", self.bytes.len() - self.position)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(body_len: u32, data_len: u32) -> FrameHeader {
        FrameHeader { body_len, data_len, request_id: 42, epoch: 7 }
    }

    fn descriptor(length: u64) -> Descriptor {
        Descriptor { address: 0x7f00_0000_1000, length, key: vec![1, 2, 3, 4, 5] }
    }

    #[test]
    fn request_headers_round_trip() {
        let cases = [
            RequestHeader { frame: frame(10, 100), source: None, destination: None, eager_reply: true },
            RequestHeader { frame: frame(10, 1 << 20), source: Some(descriptor(1 << 20)), destination: None, eager_reply: false },
            RequestHeader { frame: frame(10, 0), source: None, destination: Some(descriptor(4096)), eager_reply: false },
            RequestHeader { frame: frame(3, 8192), source: Some(descriptor(8192)), destination: Some(descriptor(64)), eager_reply: true },
        ];
        let mut bytes = Vec::new();
        for header in cases {
            header.encode(&mut bytes);
            let payload = header.frame.body_len as usize + header.inline_data();
            assert_eq!(RequestHeader::decode(&bytes, payload), Ok(header));
        }
    }

    #[test]
    fn response_headers_round_trip() {
        let mut bytes = Vec::new();
        for header in [ResponseHeader { frame: frame(5, 100), placed: false }, ResponseHeader { frame: frame(5, 1 << 20), placed: true }] {
            header.encode(&mut bytes);
            assert_eq!(ResponseHeader::decode(&bytes, 5 + header.inline_data()), Ok(header));
        }
    }

    #[test]
    fn malformed_headers_are_protocol_errors() {
        let mut bytes = Vec::new();
        let header = RequestHeader { frame: frame(10, 1 << 20), source: Some(descriptor(1 << 20)), destination: None, eager_reply: false };
        header.encode(&mut bytes);
        for cut in 0..bytes.len() {
            assert!(matches!(RequestHeader::decode(&bytes[..cut], 10), Err(Error::Protocol(_))), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(RequestHeader::decode(&longer, 10).is_err(), "trailing bytes");
        assert!(RequestHeader::decode(&bytes, 11).is_err(), "a payload longer than announced");
        let mismatched = RequestHeader { frame: frame(10, 100), source: Some(descriptor(1 << 20)), destination: None, eager_reply: false };
        mismatched.encode(&mut bytes);
        assert!(RequestHeader::decode(&bytes, 10).is_err(), "a source whose length is not the data length");
        let huge =
            RequestHeader { frame: frame(1, 0), source: None, destination: Some(descriptor(MAX_DATA_LEN as u64 + 1)), eager_reply: false };
        huge.encode(&mut bytes);
        assert!(RequestHeader::decode(&bytes, 1).is_err(), "a destination beyond the data limit");
        let mut flags = Vec::new();
        RequestHeader { frame: frame(1, 0), source: None, destination: None, eager_reply: false }.encode(&mut flags);
        flags[HEADER_LEN] = 0x80;
        assert!(RequestHeader::decode(&flags, 1).is_err(), "unknown flags");
        let mut response = Vec::new();
        ResponseHeader { frame: frame(1, 0), placed: false }.encode(&mut response);
        response[HEADER_LEN] = 2;
        assert!(ResponseHeader::decode(&response, 1).is_err(), "an invalid placed flag");
    }
}
