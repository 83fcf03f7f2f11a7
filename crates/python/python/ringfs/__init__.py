"""ringfs from Python: the native client of the job-scoped parallel file system.

ringfs spreads files over the node-local storage of a job's nodes, one server per node; this
package talks to the servers directly (no FUSE, no kernel round trip, no extra copy), with
the GIL released during I/O.

- ``Client`` — a connection with an ``os``-like API: ``open`` (``io`` file objects),
  ``stat``, ``listdir``, ``scandir``, ``walk``, ``mkdir``, ``makedirs``, ``remove``,
  ``rmdir``, ``rename``, ``rmtree``, and ``sync``/``stagein`` for cache mode.
  ``Client.from_env()`` uses the cluster ``eval "$(ringfs start)"`` described.
- ``RawFile`` — an open file as an ``io.RawIOBase``; ``readinto`` fills any writable buffer
  (NumPy arrays too) in place, ``pread``/``readinto_at`` read at an offset for many threads.
- ``Cluster`` — starts and stops a local cluster in a ``with`` block (notebooks, tests).
- ``ringfs.fsspec.RingFileSystem`` — the ``ringfs://`` protocol for fsspec, so pandas,
  pyarrow, Dask and zarr read and write ringfs: ``pandas.read_parquet("ringfs:///data/x.parquet")``.

Errors are the ``OSError`` subclasses ``os`` raises (``FileNotFoundError`` for ENOENT, ...).

Example::

    import ringfs
    with ringfs.Cluster(servers=2) as cluster:
        client = cluster.client()
        client.makedirs("/results", exist_ok=True)
        with client.open("/results/log.txt", "w") as f:
            f.write("hello\\n")
        print(client.stat("/results/log.txt").st_size)   # 6
"""

from ._client import Client, DirEntry, RawFile, StatResult
from ._cluster import Cluster, find_executable
from ._native import DEFAULT_CHUNK_SIZE

__all__ = ["Client", "Cluster", "DirEntry", "RawFile", "StatResult", "DEFAULT_CHUNK_SIZE", "find_executable"]
