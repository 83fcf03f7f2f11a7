"""Helpers that raise the OSError subclass os functions would raise."""

import errno
import os


def os_error(code, path, path2=None):
    """``OSError(code, strerror, path)``: Python picks the subclass from ``code``."""
    if path2 is None:
        return OSError(code, os.strerror(code), path)
    return OSError(code, os.strerror(code), path, None, path2)


ENOENT = errno.ENOENT
EEXIST = errno.EEXIST
ENOTDIR = errno.ENOTDIR
EISDIR = errno.EISDIR
EINVAL = errno.EINVAL
EOPNOTSUPP = errno.EOPNOTSUPP
