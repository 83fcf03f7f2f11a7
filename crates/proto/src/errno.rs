//! POSIX error numbers as they travel on the wire.
//!
//! ringfs reports every failure of a file-system operation as an errno value, so that the FUSE
//! mount and the C library can hand it to applications unchanged. The numeric values are the
//! Linux ones (ringfs servers and clients run on Linux).

use std::fmt;

/// A POSIX error number (Linux numbering). `Errno(0)` never appears in an error position.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(1);
    pub const ENOENT: Errno = Errno(2);
    pub const EINTR: Errno = Errno(4);
    pub const EIO: Errno = Errno(5);
    pub const E2BIG: Errno = Errno(7);
    pub const EBADF: Errno = Errno(9);
    pub const EAGAIN: Errno = Errno(11);
    pub const ENOMEM: Errno = Errno(12);
    pub const EACCES: Errno = Errno(13);
    pub const EFAULT: Errno = Errno(14);
    pub const EBUSY: Errno = Errno(16);
    pub const EEXIST: Errno = Errno(17);
    pub const EXDEV: Errno = Errno(18);
    pub const ENOTDIR: Errno = Errno(20);
    pub const EISDIR: Errno = Errno(21);
    pub const EINVAL: Errno = Errno(22);
    pub const EMFILE: Errno = Errno(24);
    pub const ENOTTY: Errno = Errno(25);
    pub const EFBIG: Errno = Errno(27);
    pub const ENOSPC: Errno = Errno(28);
    pub const ESPIPE: Errno = Errno(29);
    pub const EROFS: Errno = Errno(30);
    pub const EMLINK: Errno = Errno(31);
    pub const ERANGE: Errno = Errno(34);
    pub const ENAMETOOLONG: Errno = Errno(36);
    pub const ENOSYS: Errno = Errno(38);
    pub const ENOTEMPTY: Errno = Errno(39);
    pub const ELOOP: Errno = Errno(40);
    /// No such extended attribute (ENOATTR).
    pub const ENODATA: Errno = Errno(61);
    pub const EPROTO: Errno = Errno(71);
    pub const EOVERFLOW: Errno = Errno(75);
    pub const EMSGSIZE: Errno = Errno(90);
    pub const EOPNOTSUPP: Errno = Errno(95);
    pub const ECONNREFUSED: Errno = Errno(111);
    pub const ETIMEDOUT: Errno = Errno(110);
    pub const ESTALE: Errno = Errno(116);

    /// The raw errno value, as `errno` would hold it in C.
    pub fn code(self) -> i32 {
        self.0
    }

    /// The system's description of this error ("No such file or directory", ...).
    pub fn describe(self) -> String {
        let text = std::io::Error::from_raw_os_error(self.0).to_string();
        match text.rfind(" (os error ") {
            Some(end) => text[..end].to_string(),
            None => text,
        }
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Errno({}: {})", self.0, self.describe())
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl std::error::Error for Errno {}

impl From<std::io::Error> for Errno {
    /// Keeps the OS error number when there is one; anything else is an I/O error.
    fn from(error: std::io::Error) -> Self {
        match error.raw_os_error() {
            Some(code) if code > 0 => Errno(code),
            _ => match error.kind() {
                std::io::ErrorKind::NotFound => Errno::ENOENT,
                std::io::ErrorKind::AlreadyExists => Errno::EEXIST,
                std::io::ErrorKind::PermissionDenied => Errno::EACCES,
                std::io::ErrorKind::TimedOut => Errno::ETIMEDOUT,
                std::io::ErrorKind::InvalidInput => Errno::EINVAL,
                _ => Errno::EIO,
            },
        }
    }
}

impl From<Errno> for std::io::Error {
    fn from(errno: Errno) -> Self {
        std::io::Error::from_raw_os_error(errno.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_keep_their_os_code() {
        let error = std::io::Error::from_raw_os_error(39);
        assert_eq!(Errno::from(error), Errno::ENOTEMPTY);
        assert_eq!(Errno::from(std::io::Error::other("x")), Errno::EIO);
        assert_eq!(Errno::ENOENT.describe(), "No such file or directory");
    }
}
