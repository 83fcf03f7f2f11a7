//! Fault injection for this crate's tests: per-thread hooks that widen a race's window or
//! stop an operation where a server could die, so that a test can make the interleaving it
//! needs happen every time.

use std::cell::{Cell, RefCell};
use std::thread::LocalKey;
use std::time::Duration;

/// A hook run once, by the next operation on its thread that reaches it.
pub(crate) type OnceHook = RefCell<Option<Box<dyn FnOnce()>>>;

/// Where a backend move stops, as a server that died there would (the test then reopens
/// the store).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Death {
    Never,
    BeforeRename,
    AfterRename,
}

thread_local! {
    /// How long a create pauses between making a new file's inode and entering it in the
    /// index.
    pub(crate) static PAUSE_BEFORE_INDEXING: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    /// Between a flush's opening of the backend file and its writes.
    pub(crate) static AFTER_FLUSH_OPEN: OnceHook = const { RefCell::new(None) };
    /// Between checking the backend file a link is made to and linking it.
    pub(crate) static BEFORE_LINK: OnceHook = const { RefCell::new(None) };
    /// Where backend moves stop.
    pub(crate) static DEATH: Cell<Death> = const { Cell::new(Death::Never) };
    /// A write stops right after changing the chunk's bytes, before recording the change (as
    /// a server that died there would).
    pub(crate) static DIE_AFTER_CHANGE: Cell<bool> = const { Cell::new(false) };
    /// A cut stops after recording the chunk's new length, before its bytes are cut.
    pub(crate) static DIE_BEFORE_CUTTING_BYTES: Cell<bool> = const { Cell::new(false) };
}

/// Runs `hook` if one is set on this thread (once).
pub(crate) fn run(hook: &'static LocalKey<OnceHook>) {
    if let Some(hook) = hook.take() {
        hook();
    }
}

/// Sets `hook` to run `action` once.
pub(crate) fn set(hook: &'static LocalKey<OnceHook>, action: impl FnOnce() + 'static) {
    hook.set(Some(Box::new(action)));
}

/// Whether `hook` ran (or was never set).
pub(crate) fn ran(hook: &'static LocalKey<OnceHook>) -> bool {
    hook.with_borrow(Option::is_none)
}
