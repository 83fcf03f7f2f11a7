#!/usr/bin/env bash
# What renames and lock grants through a mount cost when the kernel holds many inodes. For
# each build given (label=path), in alternating rounds: a 2-server cluster and a mount,
# KNOWN files in 100 directories made and then looked up through the mount (the kernel keeps
# them, so the mount's inode table holds them), then in a directory of their own 2,000
# renames of one file back and forth and 2,000 `lockf` lock + unlock pairs (each lock a grant:
# the mount has the kernel drop the file's cache and the names beside it). Prints µs per
# create, per rename and per pair, and the mount's resident memory. docs/PERFORMANCE.md ("Renames and lock grants beside many inodes") has
# the figures. Usage:
#   KNOWN=50000 scripts/fuse-known-inodes.sh ROUNDS label=path [label=path ...]
set -euo pipefail
rounds=$1
shift
known=${KNOWN:-50000}
work=$(mktemp -d /tmp/ringfs-known-inodes-XXXXXX)
mount_pid=
binary=
cleanup() {
    if [ -n "$mount_pid" ]; then
        kill "$mount_pid" 2> /dev/null || true
        wait "$mount_pid" 2> /dev/null || true
        mount_pid=
    fi
    [ -n "$binary" ] && "$binary" stop --run-dir "$work/run" > /dev/null 2>&1 || true
}
trap 'cleanup; rm -rf "$work"' EXIT
for round in $(seq "$rounds"); do
    for build in "$@"; do
        label=${build%%=*}
        binary=$(realpath "${build#*=}")
        rm -rf "$work/run" && mkdir -p "$work/mnt"
        eval "$("$binary" start --servers 2 --run-dir "$work/run" 2> /dev/null)"
        "$binary" mount "$work/mnt" > "$work/mount-$label.log" 2>&1 &
        mount_pid=$!
        for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.1; done
        timeout 600 python3 - "$work/mnt" "$known" "$label" "$round" << 'PYTHON'
import fcntl, os, sys, time
mount, known, label, round_ = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
started = time.perf_counter()
for index in range(known):
    directory = f"{mount}/tree/d{index % 100}"
    if index < 100:
        os.makedirs(directory)
    os.close(os.open(f"{directory}/f{index}", os.O_CREAT | os.O_WRONLY, 0o644))
create_us = (time.perf_counter() - started) / max(known, 1) * 1e6
held = sum(len(files) for _, _, files in os.walk(f"{mount}/tree"))
os.mkdir(f"{mount}/work")
for index in range(20):
    os.close(os.open(f"{mount}/work/beside{index}", os.O_CREAT | os.O_WRONLY, 0o644))
a, b = f"{mount}/work/a", f"{mount}/work/b"
os.close(os.open(a, os.O_CREAT | os.O_WRONLY, 0o644))
started = time.perf_counter()
for _ in range(1000):
    os.rename(a, b)
    os.rename(b, a)
rename_us = (time.perf_counter() - started) / 2000 * 1e6
fd = os.open(a, os.O_RDWR)
started = time.perf_counter()
for _ in range(2000):
    fcntl.lockf(fd, fcntl.LOCK_EX)
    fcntl.lockf(fd, fcntl.LOCK_UN)
pair_us = (time.perf_counter() - started) / 2000 * 1e6
print(f"{label} round {round_}: {held} files made ({create_us:.0f} µs each) and looked up; rename {rename_us:.0f} µs, lock + unlock {pair_us:.0f} µs")
PYTHON
        echo "$label round $round: the mount's resident memory $(awk '/VmRSS/ {print $2, $3}' /proc/$mount_pid/status)"
        cleanup
    done
done
