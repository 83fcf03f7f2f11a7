//! The connections of a server's event loop, by token: who holds each one right now.
//!
//! An idle connection lives here (boxed, so an entry is two words) while it is armed in
//! epoll. The thread that receives its event *takes* it — the entry is then busy and nobody
//! else can touch the connection — serves it, and *parks* it again (or releases the entry
//! when the connection ends). Tokens carry a generation, so an event that was already on its
//! way when its connection ended can never reach the connection that reuses the entry.
//!
//! Invariant: an armed connection is always parked here. `park` therefore arms it while the
//! registry's lock is held, after the connection is back: an event that fires at once finds
//! it, and a thread that closes an idle connection (taking it under the same lock) can never
//! race with its arming.

use parking_lot::{Mutex, MutexGuard};

/// Names a registered connection in epoll events: entry index and generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token(u64);

/// Tokens at or above this value name the loop's own descriptors, never a connection.
pub const FIRST_SPECIAL_TOKEN: u64 = u64::MAX - 1024;

impl Token {
    fn new(index: u32, generation: u32) -> Token {
        Token(u64::from(generation) << 32 | u64::from(index))
    }

    fn index(self) -> usize {
        (self.0 & 0xFFFF_FFFF) as usize
    }

    fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The connection token an epoll event carries, if it is one.
    pub fn from_event(raw: u64) -> Option<Token> {
        (raw < FIRST_SPECIAL_TOKEN).then_some(Token(raw))
    }

    pub fn raw(self) -> u64 {
        self.0
    }
}

enum State<P> {
    Free,
    /// Parked and armed: waits for its next event.
    Idle(Box<P>),
    /// Taken by a thread.
    Busy,
}

struct Entry<P> {
    generation: u32,
    state: State<P>,
}

struct Entries<P> {
    entries: Vec<Entry<P>>,
    free: Vec<u32>,
}

/// Connections by token.
pub struct Registry<P> {
    inner: Mutex<Entries<P>>,
}

impl<P> Registry<P> {
    pub fn new() -> Registry<P> {
        Registry { inner: Mutex::new(Entries { entries: Vec::new(), free: Vec::new() }) }
    }

    fn lock(&self) -> MutexGuard<'_, Entries<P>> {
        self.inner.lock()
    }

    /// A new busy entry for a connection its caller holds (to be parked or released).
    pub fn reserve(&self) -> Token {
        let mut inner = self.lock();
        match inner.free.pop() {
            Some(index) => {
                let entry = &mut inner.entries[index as usize];
                debug_assert!(matches!(entry.state, State::Free));
                entry.state = State::Busy;
                Token::new(index, entry.generation)
            }
            None => {
                let index = u32::try_from(inner.entries.len()).expect("fewer than 2^32 connections");
                inner.entries.push(Entry { generation: 0, state: State::Busy });
                Token::new(index, 0)
            }
        }
    }

    /// Takes the idle connection `token` names, if `wanted` says so; `None` if it is busy,
    /// gone, or not wanted.
    pub fn take_if(&self, token: Token, wanted: impl FnOnce(&P) -> bool) -> Option<Box<P>> {
        let mut inner = self.lock();
        let entry = inner.entries.get_mut(token.index()).filter(|entry| entry.generation == token.generation())?;
        match &entry.state {
            State::Idle(peer) if wanted(peer) => {}
            _ => return None,
        }
        match std::mem::replace(&mut entry.state, State::Busy) {
            State::Idle(peer) => Some(peer),
            _ => unreachable!("checked idle above"),
        }
    }

    /// Takes the idle connection `token` names.
    pub fn take(&self, token: Token) -> Option<Box<P>> {
        self.take_if(token, |_| true)
    }

    /// Gives back a connection taken (or reserved) as `token`, and arms it with `arm` while
    /// it is parked. If arming fails, the connection is handed back busy with the error.
    pub fn park<E>(&self, token: Token, peer: Box<P>, arm: impl FnOnce(&P) -> Result<(), E>) -> Result<(), (Box<P>, E)> {
        let mut inner = self.lock();
        let entry = &mut inner.entries[token.index()];
        debug_assert!(entry.generation == token.generation() && matches!(entry.state, State::Busy));
        if let Err(error) = arm(&peer) {
            return Err((peer, error));
        }
        entry.state = State::Idle(peer);
        Ok(())
    }

    /// Ends the entry of a connection taken as `token` (which its caller has closed).
    pub fn release(&self, token: Token) {
        let mut inner = self.lock();
        let entry = &mut inner.entries[token.index()];
        debug_assert!(entry.generation == token.generation() && matches!(entry.state, State::Busy));
        entry.state = State::Free;
        entry.generation = entry.generation.wrapping_add(1);
        inner.free.push(token.index() as u32);
    }

    /// Takes every idle connection out, ending their entries (the server is stopping).
    pub fn drain_idle(&self) -> Vec<Box<P>> {
        let mut inner = self.lock();
        let mut drained = Vec::new();
        let mut freed = Vec::new();
        for (index, entry) in inner.entries.iter_mut().enumerate() {
            if matches!(entry.state, State::Idle(_))
                && let State::Idle(peer) = std::mem::replace(&mut entry.state, State::Free)
            {
                entry.generation = entry.generation.wrapping_add(1);
                drained.push(peer);
                freed.push(index as u32);
            }
        }
        inner.free.extend(freed);
        drained
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_connection_is_nobody_elses_until_parked() {
        let registry = Registry::new();
        let token = registry.reserve();
        assert!(registry.take(token).is_none(), "a reserved entry is busy");
        registry.park(token, Box::new(7), |_| Ok::<(), ()>(())).unwrap();
        let peer = registry.take(token).expect("parked");
        assert_eq!(*peer, 7);
        assert!(registry.take(token).is_none(), "taken once only");
        registry.park(token, peer, |_| Ok::<(), ()>(())).unwrap();
        assert!(registry.take_if(token, |peer| *peer == 8).is_none(), "not wanted: stays parked");
        assert!(registry.take_if(token, |peer| *peer == 7).is_some());
    }

    #[test]
    fn a_released_entry_is_reused_under_a_new_generation() {
        let registry = Registry::new();
        let old = registry.reserve();
        registry.release(old);
        let new = registry.reserve();
        assert_eq!(old.index(), new.index());
        assert_ne!(old, new);
        registry.park(new, Box::new(1), |_| Ok::<(), ()>(())).unwrap();
        assert!(registry.take(old).is_none(), "a stale token never reaches the new connection");
        assert!(registry.take(new).is_some());
    }

    #[test]
    fn a_failed_arming_hands_the_connection_back() {
        let registry = Registry::new();
        let token = registry.reserve();
        let (peer, error) = registry.park(token, Box::new(3), |_| Err("no")).unwrap_err();
        assert_eq!((*peer, error), (3, "no"));
        registry.release(token);
        assert!(registry.drain_idle().is_empty());
    }

    #[test]
    fn draining_takes_the_idle_connections_only() {
        let registry = Registry::new();
        let idle = registry.reserve();
        let busy = registry.reserve();
        registry.park(idle, Box::new(1), |_| Ok::<(), ()>(())).unwrap();
        let drained = registry.drain_idle();
        assert_eq!(drained.len(), 1);
        assert!(registry.take(idle).is_none());
        registry.release(busy);
    }
}
