"""The Python face of the native client: ``Client``, file objects and directory entries."""

import io
import os
import posixpath
import stat as stat_module

from . import _native
from ._errors import EINVAL, os_error

StatResult = _native.StatResult


def _path(path):
    """A ringfs path as the native client takes it: a str, absolute."""
    path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not path.startswith("/"):
        path = "/" + path
    return path


class RawFile(io.RawIOBase):
    """An open ringfs file as an unbuffered ``io.RawIOBase``.

    ``readinto`` reads straight into the caller's buffer (any object with the buffer
    protocol: bytearray, memoryview, NumPy array, mmap) and ``write`` sends straight from it;
    neither copies, and both release the GIL while the servers work. ``Client.open`` wraps it
    in ``io.BufferedReader``/``BufferedWriter``/``TextIOWrapper`` as ``open()`` does.

    ``pread(size, offset)`` and ``readinto_at(buffer, offset)`` read at an offset without
    moving the position, so many threads may share one file.
    """

    def __init__(self, native, name, mode):
        super().__init__()
        self._native = native
        self.name = name
        self.mode = mode
        self._readable = "r" in mode or "+" in mode
        self._writable = any(flag in mode for flag in "wax+")

    @property
    def chunk_size(self):
        """The file's chunk size (the servers store it in pieces of this size)."""
        return self._native.chunk_size

    def readable(self):
        self._checkClosed()
        return self._readable

    def writable(self):
        self._checkClosed()
        return self._writable

    def seekable(self):
        self._checkClosed()
        return True

    def fileno(self):
        raise io.UnsupportedOperation("a ringfs file has no kernel file descriptor")

    def readinto(self, buffer):
        self._checkClosed()
        if not self._readable:
            raise io.UnsupportedOperation("File not open for reading")
        return self._native.readinto(buffer)

    def readinto_at(self, buffer, offset):
        """Fills ``buffer`` from ``offset`` (less at the end of the file); returns the count.
        The position does not move."""
        self._checkClosed()
        return self._native.readinto_at(buffer, offset)

    def pread(self, size, offset):
        """Up to ``size`` bytes from ``offset``, as bytes; the position does not move."""
        buffer = bytearray(size)
        count = self.readinto_at(buffer, offset)
        del buffer[count:]
        return bytes(buffer)

    def readall(self):
        self._checkClosed()
        if not self._readable:
            raise io.UnsupportedOperation("File not open for reading")
        position = self.tell()
        remaining = max(self._native.fstat().st_size - position, 0)
        buffer = bytearray(remaining)
        count = self._native.readinto(buffer) if remaining else 0
        del buffer[count:]
        # The file may have grown since the fstat: read on until the end.
        while True:
            more = bytearray(max(self.chunk_size, 1 << 16))
            read = self._native.readinto(more)
            if not read:
                return bytes(buffer)
            buffer += more[:read]

    def write(self, data):
        self._checkClosed()
        if not self._writable:
            raise io.UnsupportedOperation("File not open for writing")
        return self._native.write(data)

    def write_at(self, data, offset):
        """Writes ``data`` at ``offset``; the position does not move."""
        self._checkClosed()
        return self._native.write_at(data, offset)

    def seek(self, offset, whence=io.SEEK_SET):
        self._checkClosed()
        return self._native.seek(offset, whence)

    def tell(self):
        return self.seek(0, io.SEEK_CUR)

    def truncate(self, size=None):
        self._checkClosed()
        if size is None:
            size = self.tell()
        self._native.truncate(size)
        return size

    def fstat(self):
        """The file's ``StatResult``."""
        self._checkClosed()
        return self._native.fstat()

    def fsync(self):
        """Makes the data written so far durable on the servers."""
        self._checkClosed()
        self._native.fsync()

    def close(self):
        if not self.closed:
            try:
                super().close()
            finally:
                self._native.close()

    def __repr__(self):
        return f"<ringfs.RawFile name={self.name!r} mode={self.mode!r}>"


def _open_flags(mode):
    """POSIX flags and the normalized binary mode of a Python ``open`` mode."""
    kinds = set(mode)
    if len(kinds) != len(mode) or not kinds <= set("rwxab+t") or len(kinds & set("rwxa")) != 1 or {"b", "t"} <= kinds:
        raise ValueError(f"invalid mode: {mode!r}")
    plus = "+" in kinds
    if "r" in kinds:
        flags, raw_mode = (_native.O_RDWR if plus else _native.O_RDONLY), "r"
    else:
        flags = (_native.O_RDWR if plus else _native.O_WRONLY) | _native.O_CREAT
        if "w" in kinds:
            flags, raw_mode = flags | _native.O_TRUNC, "w"
        elif "x" in kinds:
            flags, raw_mode = flags | _native.O_EXCL, "x"
        else:
            flags, raw_mode = flags | _native.O_APPEND, "a"
    return flags, raw_mode + ("+" if plus else "") + "b"


class DirEntry:
    """One entry of ``Client.scandir``, like ``os.DirEntry``: its attributes came with the
    listing, so ``is_dir()``, ``is_file()`` and ``stat()`` cost no further request
    (``stat()`` of a symbolic link asks the servers for its target)."""

    __slots__ = ("name", "path", "_stat", "_client")

    def __init__(self, client, directory, name, stat):
        self.name = name
        self.path = posixpath.join(directory, name)
        self._stat = stat
        self._client = client

    def is_dir(self, *, follow_symlinks=True):
        if follow_symlinks and self._stat.is_symlink():
            return self._target_is(stat_module.S_ISDIR)
        return self._stat.is_dir()

    def is_file(self, *, follow_symlinks=True):
        if follow_symlinks and self._stat.is_symlink():
            return self._target_is(stat_module.S_ISREG)
        return self._stat.is_file()

    def is_symlink(self):
        return self._stat.is_symlink()

    def _target_is(self, test):
        try:
            return test(self._client.stat(self.path).st_mode)
        except OSError:
            return False

    def stat(self, *, follow_symlinks=True):
        if follow_symlinks and self._stat.is_symlink():
            return self._client.stat(self.path)
        return self._stat

    def inode(self):
        return self._stat.st_ino

    def __fspath__(self):
        return self.path

    def __repr__(self):
        return f"<ringfs.DirEntry {self.name!r}>"


class Client:
    """A connection to a ringfs file system, with an ``os``-like API.

    ``Client.from_env()`` connects as ``eval "$(ringfs start)"`` describes the cluster
    (RINGFS_SERVER, RINGFS_SECRET, RINGFS_RUN_DIR); ``Client(servers, secret)`` names it.
    Paths are absolute ringfs paths (a relative one is taken from the root). Calls are
    thread-safe and release the GIL. Errors are the ``OSError`` subclasses ``os`` raises
    (``FileNotFoundError``, ``FileExistsError``, ``NotADirectoryError``, ...), errno set.

    >>> client = ringfs.Client.from_env()
    >>> with client.open("/data/hello.txt", "w") as f:
    ...     f.write("hello")
    >>> client.listdir("/data")
    ['hello.txt']
    """

    def __init__(self, servers=None, secret=None, *, chunk_size=None, timeout_ms=None, run_dir=None, _native_client=None):
        if _native_client is not None:
            self._native = _native_client
            return
        if isinstance(servers, str):
            servers = [server for server in servers.split(",") if server.strip()]
        if run_dir is None and not servers:
            raise ValueError("name the servers (or a run directory), or use Client.from_env()")
        if run_dir is not None:
            run_dir = os.fspath(run_dir)
        self._native = _native.Client(list(servers or []), secret or "", chunk_size, timeout_ms, run_dir)

    @classmethod
    def from_env(cls):
        """Connects with RINGFS_SERVER (or RINGFS_RUN_DIR), RINGFS_SECRET, RINGFS_CHUNK_SIZE,
        RINGFS_TIMEOUT_MS from the environment."""
        return cls(_native_client=_native.Client.from_env())

    # Files.

    def open(self, path, mode="r", buffering=-1, encoding=None, errors=None, newline=None, *, permissions=0o644):
        """Opens a file like the built-in ``open``: modes r, w, x, a with b, t and +.

        Binary modes give an ``io.BufferedReader``/``BufferedWriter``/``BufferedRandom``
        whose buffer is the file's chunk size (or ``buffering`` bytes), unbuffered
        (``buffering=0``) the ``RawFile``; text modes an ``io.TextIOWrapper``.
        """
        flags, raw_mode = _open_flags(mode)
        binary = "b" in mode
        if binary and encoding is not None:
            raise ValueError("binary mode doesn't take an encoding argument")
        path = _path(path)
        raw = RawFile(self._native.open(path, flags, permissions), path, raw_mode)
        try:
            if buffering == 0:
                if not binary:
                    raise ValueError("can't have unbuffered text I/O")
                return raw
            if buffering < 0 or buffering == 1:
                buffering = max(raw.chunk_size, io.DEFAULT_BUFFER_SIZE)
            if "+" in raw_mode:
                buffered = io.BufferedRandom(raw, buffering)
            elif raw_mode.startswith("r"):
                buffered = io.BufferedReader(raw, buffering)
            else:
                buffered = io.BufferedWriter(raw, buffering)
            if binary:
                return buffered
            text = io.TextIOWrapper(buffered, encoding or "utf-8", errors, newline)
            text.mode = mode
            return text
        except BaseException:
            raw.close()
            raise

    def read_bytes(self, path, offset=0, length=None):
        """The bytes of ``path`` (``length`` of them from ``offset``), in one call."""
        return self._native.read_range(_path(path), offset, length)

    def write_bytes(self, path, data):
        """Replaces the content of ``path`` with ``data`` (any bytes-like object)."""
        with self.open(path, "wb", buffering=0) as file:
            view = memoryview(data).cast("B")
            written = 0
            while written < len(view):
                written += file.write(view[written:])
            return written

    # Attributes.

    def stat(self, path):
        """The ``StatResult`` of ``path`` (symbolic links followed)."""
        return self._native.stat(_path(path))

    def lstat(self, path):
        """The ``StatResult`` of ``path`` itself."""
        return self._native.lstat(_path(path))

    def exists(self, path):
        try:
            self._native.stat(_path(path))
            return True
        except FileNotFoundError:
            return False

    def isdir(self, path):
        try:
            return self._native.stat(_path(path)).is_dir()
        except (FileNotFoundError, NotADirectoryError):
            return False

    def isfile(self, path):
        try:
            return self._native.stat(_path(path)).is_file()
        except (FileNotFoundError, NotADirectoryError):
            return False

    def truncate(self, path, length):
        self._native.truncate(_path(path), length)

    def utime(self, path, ns=None):
        """Sets ``(atime_ns, mtime_ns)``, or both to now."""
        atime_ns, mtime_ns = ns if ns is not None else (None, None)
        self._native.utime(_path(path), atime_ns, mtime_ns)

    # Directories.

    def scandir(self, path="/"):
        """The entries of directory ``path`` as ``DirEntry`` objects (a list, in no order)."""
        directory = _path(path)
        return [DirEntry(self, directory, name, stat) for name, stat in self._native.readdir(directory)]

    def listdir(self, path="/"):
        """The names in directory ``path``, sorted."""
        return sorted(name for name, _ in self._native.readdir(_path(path)))

    def mkdir(self, path, mode=0o755):
        self._native.mkdir(_path(path), mode)

    def makedirs(self, path, mode=0o755, exist_ok=False):
        """Makes ``path`` and every missing directory above it, like ``os.makedirs``."""
        path = posixpath.normpath(_path(path))
        try:
            self._native.mkdir(path, mode)
            return
        except FileNotFoundError:
            parent = posixpath.dirname(path)
            if parent == path:
                raise
            self.makedirs(parent, mode, exist_ok=True)
        except FileExistsError:
            if exist_ok and self.isdir(path):
                return
            raise
        try:
            self._native.mkdir(path, mode)
        except FileExistsError:
            if not (exist_ok and self.isdir(path)):
                raise

    def rmdir(self, path):
        self._native.rmdir(_path(path))

    def remove(self, path):
        """Removes a file (``IsADirectoryError`` for a directory)."""
        self._native.unlink(_path(path))

    unlink = remove

    def rename(self, source, destination):
        """Renames like ``os.rename``: replaces a file (or empty directory) at the destination."""
        self._native.rename(_path(source), _path(destination))

    replace = rename

    def rmtree(self, path):
        """Removes ``path`` and everything below it (a file too), on the servers."""
        path = _path(path)
        if path.rstrip("/") == "":
            raise os_error(EINVAL, path)
        self._native.remove_tree(path)

    def walk(self, top="/", topdown=True, onerror=None, followlinks=False):
        """Walks the tree below ``top`` like ``os.walk``: ``(dirpath, dirnames, filenames)``."""
        top = _path(top)
        try:
            entries = self.scandir(top)
        except OSError as error:
            if onerror is not None:
                onerror(error)
            return
        directories, files = [], []
        for entry in sorted(entries, key=lambda entry: entry.name):
            (directories if entry.is_dir(follow_symlinks=followlinks) else files).append(entry.name)
        if topdown:
            yield top, directories, files
        for name in directories:
            yield from self.walk(posixpath.join(top, name), topdown, onerror, followlinks)
        if not topdown:
            yield top, directories, files

    def symlink(self, target, link_path):
        self._native.symlink(os.fspath(target), _path(link_path))

    def readlink(self, path):
        return self._native.readlink(_path(path))

    # The cluster.

    def sync(self):
        """Cache mode: writes everything dirty back to the backend directory."""
        self._native.sync()

    def stagein(self, *paths):
        """Cache mode: loads files or trees from the backend into ringfs ahead of use.
        Returns ``(files, bytes, loaded_bytes)``."""
        return self._native.stagein([_path(path) for path in paths])

    def usage(self):
        """``(capacity_bytes, used_bytes, entries, servers)`` over the whole cluster."""
        return self._native.usage()

    def members(self):
        """The servers, as ``(name, address)`` pairs."""
        return self._native.members()

    def __repr__(self):
        return f"<ringfs.Client servers={[address for _, address in self.members()]}>"

