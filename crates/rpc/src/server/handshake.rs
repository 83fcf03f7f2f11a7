//! A connection's first frame, read a little at a time into a bounded buffer, and the
//! answer to it: the step every peer goes through before it costs more than a few bytes.

use std::io;
use std::time::Instant;

use ringfs_proto::{Errno, FrameHeader, HEADER_LEN, Hello, HelloReply, Request, Response};

use super::requests::reply;
use super::{MAX_HELLO_FRAME, Service, Shared};
use crate::transport::{Link, PeerIdentity};

/// A connection whose first frame is still arriving.
pub struct PendingHandshake {
    pub link: Link,
    /// The bytes of the first frame so far (never more than [`MAX_HELLO_FRAME`]).
    frame: Vec<u8>,
    /// Header and body length, once the header is in.
    frame_len: Option<usize>,
    pub deadline: Instant,
}

pub enum HandshakeProgress {
    Waiting,
    Complete,
    /// The peer broke a rule or closed; why (for the log), if worth logging.
    Refused(Option<String>),
}

impl PendingHandshake {
    /// Bytes of the first frame received so far (for the log of a handshake that timed out:
    /// none means the `Hello` never reached this side).
    pub fn received(&self) -> usize {
        self.frame.len()
    }

    pub fn new(link: Link, deadline: Instant) -> PendingHandshake {
        PendingHandshake { link, frame: Vec::new(), frame_len: None, deadline }
    }

    /// Reads what has arrived, never past the end of the first frame, and never waiting.
    pub fn advance(&mut self) -> HandshakeProgress {
        loop {
            let wanted = self.frame_len.unwrap_or(HEADER_LEN);
            if self.frame.len() == wanted {
                if self.frame_len.is_some() {
                    return HandshakeProgress::Complete;
                }
                let mut header = [0u8; HEADER_LEN];
                header.copy_from_slice(&self.frame);
                match FrameHeader::decode(&header) {
                    Ok(header) if header.data_len == 0 && HEADER_LEN + header.body_len as usize <= MAX_HELLO_FRAME => {
                        self.frame_len = Some(HEADER_LEN + header.body_len as usize);
                        continue;
                    }
                    Ok(header) => {
                        return HandshakeProgress::Refused(Some(format!(
                            "first frame announces {} body and {} data bytes",
                            header.body_len, header.data_len
                        )));
                    }
                    Err(error) => return HandshakeProgress::Refused(Some(format!("invalid first frame: {error}"))),
                }
            }
            let start = self.frame.len();
            self.frame.resize(wanted, 0);
            match self.link.reader.read_available(&mut self.frame[start..]) {
                Ok(0) => {
                    self.frame.truncate(start);
                    return HandshakeProgress::Refused(None);
                }
                Ok(count) => self.frame.truncate(start + count),
                Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                    self.frame.truncate(start);
                    return HandshakeProgress::Waiting;
                }
                Err(error) => {
                    self.frame.truncate(start);
                    return HandshakeProgress::Refused(Some(error.to_string()));
                }
            }
        }
    }

    /// [`PendingHandshake::advance`], refusing a peer whose deadline has passed.
    pub fn advance_until_deadline(&mut self) -> HandshakeProgress {
        match self.advance() {
            HandshakeProgress::Waiting if Instant::now() >= self.deadline => {
                HandshakeProgress::Refused(Some("handshake not complete before its deadline".into()))
            }
            progress => progress,
        }
    }

    /// The complete first frame.
    pub fn frame(&self) -> &[u8] {
        debug_assert!(self.frame_len == Some(self.frame.len()));
        &self.frame
    }
}

impl<S: Service> Shared<S> {
    /// Answers a complete first frame: the session of an accepted connection, counted as
    /// served, or `None` (refused and answered so: a wrong secret or version, not a `Hello`,
    /// or more than [`super::ServerLimits::max_connections`] served already).
    pub(super) fn answer_hello(&self, handshake: &mut PendingHandshake) -> Option<S::Session> {
        let frame = handshake.frame();
        let mut header_bytes = [0u8; HEADER_LEN];
        header_bytes.copy_from_slice(&frame[..HEADER_LEN]);
        let request_id = FrameHeader::decode(&header_bytes).map(|header| header.request_id).unwrap_or(0);
        let mut session = S::Session::default();
        let accepted = match Request::decode(&frame[HEADER_LEN..]) {
            Ok(Request::Hello(hello)) => self.admit(&hello, &handshake.link.peer, &mut session),
            Ok(_) => Err(Errno::EPROTO),
            Err(error) => {
                self.refusals.handshake.log(log::Level::Warn, format_args!("malformed handshake, closing the connection: {error}"));
                Err(Errno::EPROTO)
            }
        };
        let response = match &accepted {
            Ok(hello_reply) => Response::Hello(hello_reply.clone()),
            Err(errno) => Response::Error(*errno),
        };
        let mut body = Vec::new();
        let answered = reply(handshake.link.writer.as_mut(), request_id, self.service.epoch(), &response, &[], &mut body);
        match (accepted, answered) {
            (Ok(_), Ok(())) => Some(session),
            (Ok(_), Err(_)) => {
                self.end_session(&mut session);
                None
            }
            (Err(_), _) => None,
        }
    }

    /// Counts a connection and asks the service to accept its `Hello`; EMFILE when the
    /// server serves as many connections as it may.
    fn admit(&self, hello: &Hello, peer: &PeerIdentity, session: &mut S::Session) -> Result<HelloReply, Errno> {
        if !self.count_connection() {
            self.refusals.over_limit.log(
                log::Level::Warn,
                format_args!("refusing a connection: {} connections are served already", self.limits.max_connections),
            );
            return Err(Errno::EMFILE);
        }
        let accepted = self.service.hello(hello, peer, session);
        if accepted.is_err() {
            self.uncount_connection();
        }
        accepted
    }
}
