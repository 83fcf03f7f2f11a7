//! The C library's own functions, found behind ours with `dlsym(RTLD_NEXT, …)`: what every
//! call that is not about ringfs is handed to, unchanged.

use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One function of the next library in the search order (the C library), looked up on first
/// use and remembered.
pub(crate) struct Symbol {
    name: &'static CStr,
    address: AtomicUsize,
}

impl Symbol {
    pub(crate) const fn new(name: &'static CStr) -> Symbol {
        Symbol { name, address: AtomicUsize::new(0) }
    }

    /// The function's address. A C library without it is a broken installation: the process
    /// stops with a message rather than jump to nowhere.
    pub(crate) fn address(&self) -> usize {
        let known = self.address.load(Ordering::Relaxed);
        if known != 0 {
            return known;
        }
        // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds the definition after ours.
        let found = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) } as usize;
        if found == 0 {
            let message = format!("ringfs preload: the C library has no {:?}\n", self.name);
            // SAFETY: writing a buffer we own to stderr, then ending the process.
            unsafe {
                libc::write(2, message.as_ptr().cast(), message.len());
                libc::abort();
            }
        }
        self.address.store(found, Ordering::Relaxed);
        found
    }
}

/// Calls the C library's `name` with the given signature and arguments:
/// `real!("read", fn(c_int, *mut c_void, usize) -> isize; fd, buffer, count)`.
macro_rules! real {
    ($name:literal, fn($($type:ty),*) -> $ret:ty; $($argument:expr),* $(,)?) => {{
        static SYMBOL: $crate::real::Symbol = $crate::real::Symbol::new(
            // SAFETY: the literal has a NUL at its end and none inside.
            unsafe { ::std::ffi::CStr::from_bytes_with_nul_unchecked(concat!($name, "\0").as_bytes()) },
        );
        // SAFETY: the symbol is the C library's function of this signature.
        #[allow(unused_unsafe)]
        let function: unsafe extern "C" fn($($type),*) -> $ret = unsafe { ::std::mem::transmute(SYMBOL.address()) };
        // SAFETY: the arguments are the caller's, passed on unchanged.
        #[allow(unused_unsafe)]
        let result = unsafe { function($($argument),*) };
        result
    }};
}

pub(crate) use real;
