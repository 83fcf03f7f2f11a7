"""``Cluster``: a local ringfs cluster for the length of a ``with`` block."""

import os
import shutil

from . import _native
from ._client import Client


def find_executable(executable=None):
    """The ``ringfs`` program: ``executable``, $RINGFS_EXECUTABLE, or ``ringfs`` on $PATH."""
    candidate = executable or os.environ.get("RINGFS_EXECUTABLE") or shutil.which("ringfs")
    if not candidate or not os.access(candidate, os.X_OK):
        raise FileNotFoundError(
            "the ringfs program was not found: build it (cargo build --release) and put "
            "target/release on PATH, or set RINGFS_EXECUTABLE"
        )
    return os.path.abspath(candidate)


class Cluster:
    """Starts ``servers`` ringfs servers on this machine and stops them again.

    Use it as a context manager; the servers stop (and their run directory goes) when the
    block ends, also on an exception. ``backend`` (a directory) runs the cluster in cache
    mode over it, shown at ``mount_path``. The servers run the ``ringfs`` program (see
    ``find_executable``); ``store`` is ``"mem"`` or ``"dir:PATH"``.

    >>> with ringfs.Cluster(servers=2) as cluster:
    ...     client = cluster.client()
    ...     client.makedirs("/data", exist_ok=True)
    ...     os.environ.update(cluster.environ)   # for fsspec's ringfs:// and subprocesses

    ``environ`` holds RINGFS_SERVER, RINGFS_SECRET, RINGFS_RUN_DIR and RINGFS_CHUNK_SIZE.
    """

    def __init__(self, servers=2, backend=None, *, store="mem", chunk_size=None, mount_path="/", executable=None, run_dir=None):
        self.servers = servers
        self.backend = os.path.abspath(backend) if backend is not None else None
        self.store = store
        self.chunk_size = chunk_size
        self.mount_path = mount_path
        self.executable = executable
        self.run_dir = run_dir
        self.environ = None
        self._client = None

    def start(self):
        """Starts the servers and waits until all joined; returns ``self``."""
        if self.environ is not None:
            raise RuntimeError("the cluster is already running")
        executable = find_executable(self.executable)
        run_dir = os.fspath(self.run_dir) if self.run_dir is not None else None
        pairs = _native.launch_local(executable, self.servers, self.store, self.chunk_size, run_dir, self.backend, self.mount_path)
        self.environ = dict(pairs)
        self.run_dir = self.environ["RINGFS_RUN_DIR"]
        return self

    def client(self):
        """A ``Client`` of this cluster (the same one on every call)."""
        if self.environ is None:
            raise RuntimeError("the cluster is not running")
        if self._client is None:
            servers = self.environ["RINGFS_SERVER"].split(",")
            self._client = Client(
                servers, self.environ["RINGFS_SECRET"], chunk_size=int(self.environ["RINGFS_CHUNK_SIZE"]), run_dir=self.run_dir
            )
        return self._client

    def stop(self, keep=False):
        """Stops the servers (flushing to the backend in cache mode) and removes the run
        directory unless ``keep``. Stopping a stopped cluster does nothing."""
        if self.environ is None:
            return
        self._client = None
        environ, self.environ = self.environ, None
        _native.stop_cluster(environ["RINGFS_RUN_DIR"], keep)

    @property
    def running(self):
        return self.environ is not None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()
        return False

    def __repr__(self):
        state = f"running in {self.run_dir}" if self.running else "stopped"
        return f"<ringfs.Cluster servers={self.servers} {state}>"
