#!/usr/bin/env python3
"""Sequential bandwidth of the Python binding, as `ringfs bench micro` measures the native client.

One file of --size MiB written in --block-sized writes from one reused buffer (then fsynced),
and read back into one reused buffer, through ``ringfs.RawFile`` (no Python-side buffering);
the median of --repeats (as `bench micro` reports). With --procs N, N processes do so at once, each with its own file (as
`bench micro --procs N`), and the sum is reported. Compare with::

    ringfs bench micro --procs 1 --size 256M --files 100 --no-baseline --repeats 3

    python3 examples/python/bandwidth.py --start-cluster 2 --size 256 --repeats 3
"""

import argparse
import statistics
import multiprocessing
import os
import time


def one_process(args):
    index, size_bytes, block_bytes = args
    import ringfs

    client = ringfs.Client.from_env()
    path = f"/bandwidth-{os.getpid()}-{index}"
    block = bytearray(os.urandom(block_bytes))
    started = time.perf_counter()
    with client.open(path, "wb", buffering=0) as f:
        for _ in range(size_bytes // block_bytes):
            f.write(block)
        f.fsync()
    write_seconds = time.perf_counter() - started
    started = time.perf_counter()
    with client.open(path, "rb", buffering=0) as f:
        while f.readinto(block):
            pass
    read_seconds = time.perf_counter() - started
    client.remove(path)
    return size_bytes / write_seconds, size_bytes / read_seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=256, help="MiB per process")
    parser.add_argument("--block", type=int, default=1024, help="KiB per write and read")
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--start-cluster", type=int, metavar="SERVERS")
    args = parser.parse_args()
    cluster = None
    if args.start_cluster:
        import ringfs

        cluster = ringfs.Cluster(servers=args.start_cluster).start()
        os.environ.update(cluster.environ)
    try:
        work = [(index, args.size << 20, args.block << 10) for index in range(args.procs)]
        writes, reads = [], []
        context = multiprocessing.get_context("spawn")
        for _ in range(args.repeats):
            with context.Pool(args.procs) as pool:
                results = pool.map(one_process, work)
            writes.append(sum(write for write, _ in results))
            reads.append(sum(read for _, read in results))
        print(f"python binding: {args.procs} process(es) x {args.size} MiB in {args.block} KiB blocks, median of {args.repeats}")
        print(f"write {statistics.median(writes) / 1e9:6.2f} GB/s   read {statistics.median(reads) / 1e9:6.2f} GB/s")
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
