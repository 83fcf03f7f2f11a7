#!/usr/bin/env python3
"""Saves and loads a model's state through fsspec, and times both.

Three checkpoint formats (``--format``):

- ``numpy``: a directory with one file per array, written straight from the array's memory
  and read straight into a new array (no ``tobytes()``, no intermediate buffer: the ringfs
  file objects take any buffer), plus ``index.json`` naming each array's dtype and shape;
- ``torch``: ``torch.save`` of the state dict (PyTorch tensors) into one file opened through
  fsspec, ``torch.load`` back;
- ``dcp``: ``torch.distributed.checkpoint.save``/``load`` with its fsspec writer and reader
  (a directory of ``.distcp`` files and ``.metadata``; loading fills tensors in place).

Any fsspec URL works, so the same run measures ringfs against a local directory::

    # a local cluster started for the run (needs the ringfs program: RINGFS_EXECUTABLE or PATH)
    python3 examples/python/checkpoint.py --start-cluster 2 --size-mb 512
    # a running cluster (eval "$(ringfs start)"), and /dev/shm for comparison
    python3 examples/python/checkpoint.py --url ringfs:///ckpt --url file:///dev/shm/ckpt
    # the same with PyTorch
    python3 examples/python/checkpoint.py --format torch --url ringfs:///ckpt --url file:///dev/shm/ckpt

Each URL's write and read bandwidth (best of --repeats) is printed, and ``--json`` writes them.
"""

import argparse
import concurrent.futures
import json
import time

import fsspec
import numpy


def make_state(total_bytes, arrays=16, seed=0):
    """A stand-in for a model's state dict: ``arrays`` float32 tensors, ``total_bytes`` in all."""
    rng = numpy.random.default_rng(seed)
    per_array = max(total_bytes // arrays // 4, 1)
    return {f"layer{index}.weight": rng.standard_normal(per_array, dtype=numpy.float32) for index in range(arrays)}


def save(fs, directory, state, threads=1):
    """Writes every array of ``state`` to its own file under ``directory``, then the index."""
    fs.makedirs(directory, exist_ok=True)

    def write(name):
        array = numpy.ascontiguousarray(state[name])
        with fs.open(f"{directory}/{name}.bin", "wb") as f:
            f.write(memoryview(array).cast("B"))

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(write, state))
    index = {name: {"dtype": str(array.dtype), "shape": list(array.shape)} for name, array in state.items()}
    with fs.open(f"{directory}/index.json", "w") as f:
        json.dump(index, f)


def load(fs, directory, threads=1):
    """Reads a checkpoint written by ``save`` back into new arrays."""
    with fs.open(f"{directory}/index.json", "r") as f:
        index = json.load(f)

    def read(name):
        entry = index[name]
        array = numpy.empty(entry["shape"], dtype=entry["dtype"])
        with fs.open(f"{directory}/{name}.bin", "rb") as f:
            view = memoryview(array).cast("B")
            filled = 0
            while filled < len(view):
                count = f.readinto(view[filled:])
                if not count:
                    raise EOFError(f"{directory}/{name}.bin ends after {filled} of {len(view)} bytes")
                filled += count
        return name, array

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return dict(pool.map(read, index))


def save_torch(fs, directory, state, threads=1):
    """``torch.save`` of the state dict into ``directory/model.pt``."""
    import torch

    fs.makedirs(directory, exist_ok=True)
    with fs.open(f"{directory}/model.pt", "wb") as f:
        torch.save(state, f)


def load_torch(fs, directory, threads=1):
    import torch

    with fs.open(f"{directory}/model.pt", "rb") as f:
        return torch.load(f)


def save_dcp(fs, directory, state, threads=1, url=None):
    """``torch.distributed.checkpoint.save`` with the fsspec writer (one process)."""
    import torch.distributed.checkpoint as dcp

    # sync_files=False: the writer's fsync wants a kernel descriptor, which a ringfs file has
    # not (its flush puts the bytes on the servers); the same setting for every target.
    dcp.save(state, storage_writer=dcp.FsspecWriter(url, sync_files=False, thread_count=threads))


def load_dcp(fs, directory, threads=1, url=None, like=None):
    """``torch.distributed.checkpoint.load`` into new tensors shaped like ``like``."""
    import torch
    import torch.distributed.checkpoint as dcp

    state = {name: torch.empty_like(tensor) for name, tensor in like.items()}
    dcp.load(state, storage_reader=dcp.FsspecReader(url))
    return state


def equal(loaded, expected):
    if hasattr(expected, "numpy"):
        import torch

        return torch.equal(loaded, expected)
    return numpy.array_equal(loaded, expected)


def measure(url, state, repeats, threads, form="numpy"):
    """Best write and read bandwidth (bytes/s) of ``repeats`` save/load rounds at ``url``."""
    fs, directory = fsspec.core.url_to_fs(url)
    total = sum(array.nbytes for array in state.values())
    writes, reads = [], []
    for _ in range(repeats):
        if fs.exists(directory):
            fs.rm(directory, recursive=True)
        started = time.perf_counter()
        if form == "numpy":
            save(fs, directory, state, threads)
        elif form == "torch":
            save_torch(fs, directory, state, threads)
        else:
            save_dcp(fs, directory, state, threads, url=url)
        writes.append(total / (time.perf_counter() - started))
        started = time.perf_counter()
        if form == "numpy":
            loaded = load(fs, directory, threads)
        elif form == "torch":
            loaded = load_torch(fs, directory, threads)
        else:
            loaded = load_dcp(fs, directory, threads, url=url, like=state)
        reads.append(total / (time.perf_counter() - started))
        for name, array in state.items():
            if not equal(loaded[name], array):
                raise AssertionError(f"{url}: {name} came back different")
        del loaded
    fs.rm(directory, recursive=True)
    return max(writes), max(reads)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", action="append", help="where to save (repeatable; default ringfs:///checkpoint)")
    parser.add_argument("--size-mb", type=int, default=256, help="checkpoint size in MiB (default 256)")
    parser.add_argument("--arrays", type=int, default=16)
    parser.add_argument("--format", choices=["numpy", "torch", "dcp"], default="numpy", help="checkpoint format (default numpy)")
    parser.add_argument("--threads", type=int, default=1, help="arrays saved/loaded at once")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--start-cluster", type=int, metavar="SERVERS", help="start a local cluster of SERVERS for the run")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    urls = args.url or ["ringfs:///checkpoint"]
    state = make_state(args.size_mb << 20, args.arrays)
    if args.format != "numpy":
        import torch

        state = {name: torch.from_numpy(array) for name, array in state.items()}
    total = sum(array.nbytes for array in state.values())
    print(f"checkpoint ({args.format}): {len(state)} float32 arrays, {total / 2**20:.0f} MiB; {args.threads} thread(s); best of {args.repeats}")

    cluster = None
    if args.start_cluster:
        import os

        import ringfs

        cluster = ringfs.Cluster(servers=args.start_cluster).start()
        os.environ.update(cluster.environ)
    results = {}
    try:
        for url in urls:
            write, read = measure(url, state, args.repeats, args.threads, args.format)
            results[url] = {"write_bytes_per_second": write, "read_bytes_per_second": read}
            print(f"{url:<32} write {write / 1e9:6.2f} GB/s   read {read / 1e9:6.2f} GB/s")
    finally:
        if cluster is not None:
            cluster.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bytes": total, "format": args.format, "threads": args.threads, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
