//! Turning the client's errors into Python exceptions: the one place errno meets Python.

use pyo3::PyErr;
use pyo3::exceptions::{PyConnectionError, PyOSError, PyValueError};
use ringfs_client::{ConnectError, Errno};

/// `OSError(errno, strerror, path)`: Python turns it into the matching subclass
/// (`FileNotFoundError`, `FileExistsError`, `IsADirectoryError`, ...) with `errno` set.
pub fn os_error(errno: Errno, path: &str) -> PyErr {
    PyOSError::new_err((errno.code(), errno.describe(), path.to_string()))
}

/// [`os_error`] for a call on two paths (`rename`): `filename` and `filename2` are both set.
pub fn os_error2(errno: Errno, from: &str, to: &str) -> PyErr {
    PyOSError::new_err((errno.code(), errno.describe(), from.to_string(), None::<i32>, to.to_string()))
}

/// An error without a path (a call on an open file).
pub fn os_error_no_path(errno: Errno) -> PyErr {
    PyOSError::new_err((errno.code(), errno.describe()))
}

/// A client that could not start: a bad configuration is a `ValueError`, servers that do not
/// answer or refuse the secret a `ConnectionError`.
pub fn connect_error(error: ConnectError) -> PyErr {
    match error {
        ConnectError::Config(_) => PyValueError::new_err(error.to_string()),
        ConnectError::Unreachable(_) | ConnectError::Refused(_) => PyConnectionError::new_err(error.to_string()),
    }
}
