//! Cross-memory attach: copying bytes straight from another process on the same host.
//!
//! Linux `process_vm_readv` copies from another process's address space in one step, with no
//! socket buffer in between. ringfs uses it on same-host connections: a server pulls the bytes
//! of a write out of the client, and a client pulls the bytes of a read out of a server lease.
//! It needs permission to trace the other process (same user, and Yama's `ptrace_scope` not
//! forbidding it), so each side first proves it can read a *probe* token of the other.

use std::io;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

/// Another process whose memory this process reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessMemory {
    pid: libc::pid_t,
}

impl ProcessMemory {
    pub fn new(pid: u32) -> ProcessMemory {
        ProcessMemory { pid: pid as libc::pid_t }
    }

    /// Copies `destination.len()` bytes starting at `address` in the other process.
    pub fn read(&self, address: u64, destination: &mut [MaybeUninit<u8>]) -> io::Result<()> {
        let mut done = 0usize;
        while done < destination.len() {
            let local = libc::iovec { iov_base: destination[done..].as_mut_ptr().cast(), iov_len: destination.len() - done };
            let remote = libc::iovec { iov_base: (address as usize + done) as *mut libc::c_void, iov_len: destination.len() - done };
            // SAFETY: `local` covers memory we own exclusively; the kernel checks `remote`
            // against the other process's mappings and fails with EFAULT if it is not mapped.
            let copied = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
            match copied {
                -1 => {
                    let error = io::Error::last_os_error();
                    if error.kind() != io::ErrorKind::Interrupted {
                        return Err(error);
                    }
                }
                0 => return Err(io::Error::from_raw_os_error(libc::EFAULT)),
                count => done += count as usize,
            }
        }
        Ok(())
    }

    /// Like [`ProcessMemory::read`], into an initialised buffer.
    pub fn read_bytes(&self, address: u64, destination: &mut [u8]) -> io::Result<()> {
        // SAFETY: MaybeUninit<u8> has the layout of u8, and read() writes only initialised
        // bytes, so `destination` stays initialised.
        let destination = unsafe { &mut *(destination as *mut [u8] as *mut [MaybeUninit<u8>]) };
        self.read(address, destination)
    }

    /// True if `token` can be read at `address` in the other process.
    pub fn verify_probe(&self, (address, token): (u64, u64)) -> bool {
        let mut bytes = [MaybeUninit::<u8>::uninit(); 8];
        match self.read(address, &mut bytes) {
            // SAFETY: read() succeeded, so all 8 bytes are initialised.
            Ok(()) => u64::from_ne_bytes(unsafe { std::mem::transmute::<[MaybeUninit<u8>; 8], [u8; 8]>(bytes) }) == token,
            Err(_) => false,
        }
    }
}

/// The (address, value) of this process's probe token, for the other side to verify.
pub fn memory_probe() -> (u64, u64) {
    static TOKEN: OnceLock<Box<u64>> = OnceLock::new();
    let token = TOKEN.get_or_init(|| Box::new(random_u64() | 1));
    (&**token as *const u64 as u64, **token)
}

/// 64 random bits from a per-thread generator (xorshift64*) seeded once from the kernel:
/// for identifiers that must not collide, drawn often enough that a system call each is too
/// dear.
pub fn fast_random_u64() -> u64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new(random_u64() | 1);
    }
    STATE.with(|state| {
        let mut x = state.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

/// 64 random bits from the kernel (falls back to time and pid if getrandom fails).
pub fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into the array.
    let filled = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if filled == 8 {
        return u64::from_ne_bytes(bytes);
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    nanos ^ ((std::process::id() as u64) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_can_read_its_own_probe() {
        let own = ProcessMemory::new(std::process::id());
        let probe = memory_probe();
        assert!(own.verify_probe(probe));
        assert!(!own.verify_probe((probe.0, probe.1 ^ 1)));
        assert!(!own.verify_probe((8, probe.1)), "an unmapped address fails cleanly");
    }

    #[test]
    fn reads_copy_bytes_from_an_address() {
        let source = vec![7u8; 100_000];
        let mut destination = vec![MaybeUninit::<u8>::uninit(); 100_000];
        ProcessMemory::new(std::process::id()).read(source.as_ptr() as u64, &mut destination).unwrap();
        assert!(destination.iter().all(|byte| unsafe { byte.assume_init() } == 7));
    }
}
