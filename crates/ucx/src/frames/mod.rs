//! A request/response transport for ringfs frames over UCX.
//!
//! A request is one active message (header: the ringfs [`FrameHeader`](ringfs_proto::FrameHeader)
//! plus RMA descriptors; payload: the frame body and small data), answered by one active
//! message in the other direction. Data of at least [`FrameConfig::rma_threshold`] bytes does
//! not travel inside the messages: the [`Client`] registers the caller's buffer (through a
//! [`RegistrationCache`](crate::RegistrationCache)) and sends its remote key; the [`Server`]
//! `get`s write data from it before calling the [`Service`], and `put`s read data into it
//! (then flushes, so the bytes have landed before the response says so). Both sides use their
//! memory in place: no copy through a socket buffer, none through UCX's bounce buffers.
//!
//! The layout of the headers is in [`wire`]; the plan for carrying the ringfs RPC layer over
//! this transport is in `docs/ARCHITECTURE.md` ("UCX transport").

mod client;
mod server;
pub mod wire;

pub use client::{Client, Connection, PendingCall, Reply, Request};

pub use server::{Incoming, Outgoing, Server, Service, SharedData};

use std::time::Duration;

/// Active-message id of requests.
pub const REQUEST: u16 = 21;
/// Active-message id of responses.
pub const RESPONSE: u16 = 22;

/// The data size from which [`FrameConfig::rma_threshold`] moves data by RMA by default:
/// measured on this machine (docs/PERFORMANCE.md, "UCX transport"), and CHFS's default too.
pub const DEFAULT_RMA_THRESHOLD: usize = 32 << 10;

/// How a client moves data sections of at least [`FrameConfig::rma_threshold`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BulkTransfer {
    /// By RMA where the connection's transports do RMA natively (RDMA, `cma`, …), inside the
    /// messages (sent eagerly) where UCX would only emulate RMA over TCP. Decided per
    /// connection after its first reply, from the lanes UCX chose ([`crate::Endpoint::lanes`]).
    #[default]
    Auto,
    /// Always by RMA.
    Rma,
    /// Always inside the messages, sent eagerly however large.
    Inline,
}

/// Settings of a frame client or server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameConfig {
    /// Data sections of at least this many bytes may move by RMA instead of inside the messages.
    pub rma_threshold: usize,
    /// How long a client waits for a response (and a server for an RMA transfer).
    pub timeout: Duration,
    /// Whether large data moves by RMA (the client decides; the server follows each request).
    pub bulk: BulkTransfer,
}

impl Default for FrameConfig {
    fn default() -> FrameConfig {
        FrameConfig { rma_threshold: DEFAULT_RMA_THRESHOLD, timeout: Duration::from_secs(10), bulk: BulkTransfer::Auto }
    }
}
