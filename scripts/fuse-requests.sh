#!/usr/bin/env bash
# Which FUSE requests the kernel sends for a create, a stat, a read and an unlink through a
# ringfs mount, and how many requests reach the servers:
#   scripts/fuse-requests.sh RINGFS_BINARY [FILES]        (default 2000; needs root: tracefs)
# Starts a 2-server cluster of RINGFS_BINARY and its mount; per phase, counts the mount's
# `fuse_request_send` trace events by opcode (per file) and the servers' request counters
# (`ringfs status`, server-to-server requests included). docs/PERFORMANCE.md ("FUSE mount:
# metadata") has the figures.
set -euo pipefail
ringfs=$(realpath "$1")
files=${2:-2000}
tracing=/sys/kernel/tracing
mountpoint -q "$tracing" || mount -t tracefs nodev "$tracing"
work=$(mktemp -d /tmp/ringfs-fuse-requests-XXXXXX)
eval "$("$ringfs" start --servers 2 --run-dir "$work/run" 2>/dev/null)"
mkdir "$work/mnt"
"$ringfs" mount "$work/mnt" > "$work/mount.log" 2>&1 &
mount_pid=$!
cleanup() {
    echo 0 > "$tracing/events/fuse/fuse_request_send/enable"
    kill "$mount_pid" 2>/dev/null || true
    wait "$mount_pid" 2>/dev/null || true
    "$ringfs" stop > /dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.1; done
connection=$(stat -c %d "$work/mnt")
server_requests() { "$ringfs" status 2>/dev/null | awk '$1 ~ /^server-/ { total += $(NF-1) } END { print total }'; }
for phase in create stat read unlink; do
    echo > "$tracing/trace"
    echo 1 > "$tracing/events/fuse/fuse_request_send/enable"
    before=$(server_requests)
    python3 - "$work/mnt/dir" "$phase" "$files" <<'PYTHON'
import os, sys
root, phase, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
if phase == "create":
    os.mkdir(root)
for index in range(count):
    path = f"{root}/f{index}"
    if phase == "create":
        descriptor = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        os.write(descriptor, b"x" * 3901)
        os.close(descriptor)
    elif phase == "stat":
        os.stat(path)
    elif phase == "read":
        with open(path, "rb") as file:
            file.read()
    else:
        os.unlink(path)
PYTHON
    after=$(server_requests)
    echo 0 > "$tracing/events/fuse/fuse_request_send/enable"
    echo "$phase: server requests per file: $(awk -v a="$after" -v b="$before" -v n="$files" 'BEGIN { printf "%.2f", (a - b) / n }')"
    grep "connection $connection " "$tracing/trace" | grep -o "(FUSE_[A-Z_]*)" | sort | uniq -c | sort -rn \
        | awk -v n="$files" '$1 / n >= 0.01 { printf "    %s %.2f per file\n", $2, $1 / n }'
    # (The stat phase comes after the attributes of the create phase expired.)
    sleep 1.5
done
