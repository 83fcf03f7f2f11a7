//! Processes: what `fork` does to the ringfs state.
//!
//! A child after `fork` has the parent's descriptors (the kernel copies the placeholders and
//! this library's table is copied with the memory), but not the parent's client: its
//! connections are shared with the parent and its background thread is not running. The
//! child therefore connects anew on first use, and reopens each inherited file by id when it
//! first touches it (`OpenDescription::handle`); positions are copied, not shared, from then
//! on. The library's locks are held across the `fork` so that the child never inherits one
//! taken by another thread.

use std::sync::Once;

static INSTALLED: Once = Once::new();

/// Registers the `fork` handlers (once, when the client is first connected).
pub(crate) fn install_fork_handlers() {
    INSTALLED.call_once(|| {
        // SAFETY: registering handlers with the C library; they are plain functions.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

extern "C" fn prepare() {
    crate::state::lock_client_for_fork();
    crate::descriptors::lock_for_fork();
}

extern "C" fn parent() {
    crate::descriptors::unlock_after_fork();
    crate::state::unlock_client_after_fork();
}

extern "C" fn child() {
    crate::descriptors::unlock_after_fork();
    crate::state::unlock_client_after_fork();
    crate::state::forget_client_after_fork();
}
