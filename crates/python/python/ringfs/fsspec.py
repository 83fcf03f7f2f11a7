"""``RingFileSystem``: ringfs as an fsspec file system, protocol ``ringfs://``.

Registered through the ``fsspec.specs`` entry point, so anything that takes fsspec URLs
reads and writes ringfs::

    import pandas
    df.to_parquet("ringfs:///data/table.parquet")
    pandas.read_parquet("ringfs:///data/table.parquet")

    import fsspec
    fs = fsspec.filesystem("ringfs")              # Client.from_env(): RINGFS_SERVER, ...
    fs = RingFileSystem(client=cluster.client())  # or a given client

Paths are absolute ringfs paths (``ringfs:///a/b``, ``ringfs://a/b`` and ``/a/b`` are the
same file). Files opened in binary mode are the binding's ``io.BufferedReader``/``Writer``
with a buffer of one chunk, so sequential reads fetch whole chunks ahead.

fsspec's own conformance suite (``fsspec.tests.abstract``: copy, get, put, open, pipe) runs
against it unchanged (``tests/python/test_fsspec_conformance.py``). Where it differs from
fsspec's local file system, on purpose:

- ``auto_mkdir`` is on by default (``LocalFileSystem``'s is off): writing a file —
  ``open`` for writing, ``pipe``, ``touch``, ``cp``, ``put`` — makes its missing parent
  directories, as object stores behave and zarr and Dask expect.
- A trailing ``/`` is dropped from a path (``/a/b/`` is ``/a/b``); ``cp``, ``put`` and
  ``get`` still read a target ending in ``/`` as a directory to copy into.
- ``mv`` of one path is one rename on the servers, also of a whole directory.
- ``created`` is the change time (ringfs keeps no birth time); ``checksum`` hashes the
  file's identity, size and modification time, not its bytes.
- A symbolic link's absolute target is a ringfs path (ringfs is the whole tree here; the
  FUSE mount and the LD_PRELOAD library resolve targets as the kernel sees the tree).
- Files write straight to the servers: no transactions (``autocommit=False``), no signed
  URLs.
"""

import datetime
import os
import stat as stat_module

from fsspec.spec import AbstractFileSystem
from fsspec.utils import stringify_path

from ._client import Client
from ._errors import EISDIR, os_error

_CLIENTS = {}


def _client_from_env():
    """One client per cluster the environment names (fsspec makes file systems often)."""
    key = tuple(os.environ.get(name) for name in ("RINGFS_SERVER", "RINGFS_RUN_DIR", "RINGFS_SECRET"))
    client = _CLIENTS.get(key)
    if client is None:
        client = _CLIENTS[key] = Client.from_env()
    return client


def _kind(mode):
    if stat_module.S_ISDIR(mode):
        return "directory"
    if stat_module.S_ISREG(mode):
        return "file"
    if stat_module.S_ISLNK(mode):
        return "link"
    return "other"


class RingFileSystem(AbstractFileSystem):
    """fsspec file system over a ringfs ``Client``.

    ``RingFileSystem()`` connects as the environment says (``Client.from_env()``);
    ``RingFileSystem(client=...)`` or ``RingFileSystem(servers=[...], secret=...)`` names
    the cluster. With ``auto_mkdir`` (the default, as object stores behave and zarr and
    Dask expect) writing a file makes its missing parent directories. ``info`` gives ``name``, ``size``, ``type``, ``mode``, ``ino``, ``nlink``,
    ``uid``, ``gid``, ``mtime``, ``created`` (ringfs keeps no birth time: the change time)
    and ``chunk_size``.
    """

    protocol = "ringfs"
    root_marker = "/"
    # The cluster comes from the environment when no arguments name it: fsspec's cache of
    # instances by arguments would hand out a client of a cluster since stopped.
    cachable = False

    def __init__(self, client=None, servers=None, secret=None, auto_mkdir=True, **storage_options):
        super().__init__(**storage_options)
        self.auto_mkdir = auto_mkdir
        if client is not None:
            self.client = client
        elif servers is not None:
            self.client = Client(servers, secret)
        else:
            self.client = _client_from_env()

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(one) for one in path]
        path = stringify_path(path)
        for prefix in ("ringfs://", "ringfs:"):
            if path.startswith(prefix):
                path = path[len(prefix) :]
                break
        return "/" + path.strip("/")

    def unstrip_protocol(self, name):
        return "ringfs://" + self._strip_protocol(name)

    @staticmethod
    def _get_kwargs_from_urls(path):
        return {}

    def _details(self, path, stat):
        return {
            "name": path,
            "size": stat.st_size,
            "type": _kind(stat.st_mode),
            "mode": stat.st_mode,
            "ino": stat.st_ino,
            "nlink": stat.st_nlink,
            "uid": stat.st_uid,
            "gid": stat.st_gid,
            "mtime": stat.st_mtime,
            "created": stat.st_ctime,
            "chunk_size": stat.st_blksize,
        }

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        return self._details(path, self.client.stat(path))

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        try:
            entries = self.client.scandir(path)
        except NotADirectoryError:
            info = self.info(path)
            return [info] if detail else [info["name"]]
        entries.sort(key=lambda entry: entry.name)
        if not detail:
            return [entry.path for entry in entries]
        return [self._details(entry.path, entry.stat(follow_symlinks=False)) for entry in entries]

    def exists(self, path, **kwargs):
        return self.client.exists(self._strip_protocol(path))

    def isdir(self, path):
        return self.client.isdir(self._strip_protocol(path))

    def isfile(self, path):
        return self.client.isfile(self._strip_protocol(path))

    def size(self, path):
        return self.client.stat(self._strip_protocol(path)).st_size

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if not autocommit:
            raise NotImplementedError("ringfs writes go straight to the servers: no transactions")
        path = self._strip_protocol(path)
        buffering = block_size if isinstance(block_size, int) and block_size > 0 else -1
        file = self._parents_made(lambda: self.client.open(path, mode, buffering=buffering), path, mode)
        if "b" in mode:
            # fsspec's callers look for .path and .fs on the files they get.
            try:
                file.path = path
                file.fs = self
            except AttributeError:
                pass
        return file

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        if start is None and end is None:
            return self.client.read_bytes(path)
        size = self.client.stat(path).st_size
        start = 0 if start is None else (max(size + start, 0) if start < 0 else start)
        end = size if end is None else (max(size + end, 0) if end < 0 else min(end, size))
        if end <= start:
            return b""
        return self.client.read_bytes(path, start, end - start)

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        path = self._strip_protocol(path)
        if mode == "create" and self.client.exists(path):
            raise FileExistsError(path)
        self._parents_made(lambda: self.client.write_bytes(path, value), path, "wb")

    def _parents_made(self, write, path, mode):
        """``write()``; if the parent directory is missing (and ``auto_mkdir``), makes it and
        tries again."""
        try:
            return write()
        except FileNotFoundError:
            if not self.auto_mkdir or mode.startswith("r"):
                raise
            self.client.makedirs(self._parent(path), exist_ok=True)
            return write()

    def mkdir(self, path, create_parents=True, **kwargs):
        path = self._strip_protocol(path)
        if create_parents:
            if self.client.exists(path):
                raise FileExistsError(path)
            self.client.makedirs(path, exist_ok=True)
        else:
            self.client.mkdir(path)

    def makedirs(self, path, exist_ok=False):
        self.client.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def rmdir(self, path):
        self.client.rmdir(self._strip_protocol(path))

    def rm_file(self, path):
        self.client.remove(self._strip_protocol(path))

    def _rm(self, path):
        self.rm_file(path)

    def rm(self, path, recursive=False, maxdepth=None):
        if maxdepth is not None:
            return super().rm(path, recursive=recursive, maxdepth=maxdepth)
        paths = path if isinstance(path, list) else [path]
        for path in self.expand_path(paths, recursive=False):
            if self.client.isdir(path):
                if not recursive:
                    raise os_error(EISDIR, path)
                self.client.rmtree(path)
            else:
                self.client.remove(path)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        if isinstance(path1, str) and isinstance(path2, str) and not self.has_magic(path1):
            # One rename on the servers, directories included.
            self.client.rename(self._strip_protocol(path1), self._strip_protocol(path2))
            return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    @staticmethod
    def has_magic(path):
        return any(char in path for char in "*?[")

    def cp_file(self, path1, path2, **kwargs):
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.client.isdir(path1):
            self.client.makedirs(path2, exist_ok=True)
            return
        open_target = lambda: self.client.open(path2, "wb", buffering=0)  # noqa: E731
        with self.client.open(path1, "rb", buffering=0) as source, self._parents_made(open_target, path2, "wb") as target:
            buffer = bytearray(max(source.chunk_size, 1 << 20))
            view = memoryview(buffer)
            while True:
                count = source.readinto(buffer)
                if not count:
                    break
                written = 0
                while written < count:
                    written += target.write(view[written:count])

    def touch(self, path, truncate=True, **kwargs):
        path = self._strip_protocol(path)
        if truncate or not self.client.exists(path):
            self._parents_made(lambda: self.client.open(path, "wb"), path, "wb").close()
        else:
            self.client.utime(path)

    def modified(self, path):
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    def created(self, path):
        """The change time: ringfs keeps no creation time."""
        return datetime.datetime.fromtimestamp(self.info(path)["created"], tz=datetime.timezone.utc)

    def checksum(self, path):
        """Changes whenever the file does: a hash of identity, size and modification time
        (not of the content, which would mean reading it all)."""
        info = self.info(path)
        return hash((info["ino"], info["size"], self.client.stat(info["name"]).st_mtime_ns))

    def sign(self, path, expiration=100, **kwargs):
        raise NotImplementedError("ringfs has no URLs to sign")
