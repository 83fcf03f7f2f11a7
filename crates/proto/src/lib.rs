//! The ringfs wire protocol.
//!
//! This crate defines what travels between ringfs clients and servers and between servers:
//! the [`frame`] layout (a fixed header with request id, lengths and membership epoch, then an
//! encoded message body, then raw data), the [`Request`] and [`Response`] messages, the chunk
//! metadata [`Attr`], canonical [`path`]s, and [`Errno`] values for errors. It does no I/O;
//! `ringfs-rpc` moves frames over transports.
//!
//! The encoding is a small hand-written little-endian format (see `docs/PROTOCOL.md`): every
//! decoder checks lengths against the bytes present, so malformed input is an error, never a
//! panic.
//!
//! Names and files are apart: an *entry* (a name) refers to a [`FileId`]; a file's
//! attributes and bytes are keyed by its id ([`ChunkKey`]), so renames and hard links move
//! no data.
//!
//! ```
//! use ringfs_proto::{FileId, FileOnly, Request};
//! let request = Request::Stat(FileOnly { file: FileId { anchor: 7, serial: 42 } });
//! let mut body = Vec::new();
//! request.encode(&mut body);
//! assert_eq!(Request::decode(&body).unwrap(), request);
//! ```

pub mod access;
pub mod attr;
pub mod codec;
pub mod coherence;
mod errno;
pub mod frame;
pub mod gmem;
mod id;
pub mod limits;
pub mod message;
pub mod path;
pub mod wire;

pub use attr::{ATTR_BYTES, Attr, EntryFlags, FileKind};
pub use codec::DecodeError;
pub use errno::Errno;
pub use frame::{FrameError, FrameHeader, HEADER_LEN, MAX_BODY_LEN, MAX_DATA_LEN};
pub use id::{ChunkIndex, ChunkKey, FileId, LeaseId, RenameToken};
pub use limits::MAX_FILE_SIZE;
pub use message::Credentials;
pub use message::*;
