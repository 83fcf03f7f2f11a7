//! Termination signals (SIGTERM, SIGINT, SIGHUP) handled by a waiting thread instead of a
//! signal handler: commands block them before starting threads, then wait for one.

/// The set of termination signals.
fn termination_set() -> libc::sigset_t {
    ringfs_launch::process::termination_signals()
}

/// Blocks the termination signals in this thread and every thread it starts later; returns a
/// function that waits for the next one and returns its number. Call it first in `main`'s
/// command, before any thread exists.
pub fn block_termination_signals() -> impl FnOnce() -> i32 + Send + 'static {
    let set = termination_set();
    // SAFETY: changes this thread's signal mask only.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    move || {
        let mut signal = 0;
        // SAFETY: waits for one of the blocked signals.
        unsafe { libc::sigwait(&set, &mut signal) };
        signal
    }
}

/// Like [`block_termination_signals`], but the returned function gives up after `timeout`
/// and returns `None`.
pub fn block_termination_signals_with_timeout() -> impl Fn(std::time::Duration) -> Option<i32> + Send + 'static {
    let set = termination_set();
    // SAFETY: changes this thread's signal mask only.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    move |timeout| {
        let timeout = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
        // SAFETY: waits for one of the blocked signals, at most `timeout`.
        let signal = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &timeout) };
        (signal > 0).then_some(signal)
    }
}

/// Unblocks the termination signals in a child process before it runs its program (a
/// blocked mask is inherited across exec). For `Command::pre_exec`.
pub fn unblock_in_child() -> std::io::Result<()> {
    ringfs_launch::process::unblock_termination_signals()
}
