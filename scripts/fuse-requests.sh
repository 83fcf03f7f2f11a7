#!/usr/bin/env bash
# Which FUSE requests the kernel sends for a create (with 3,901 bytes; empty), a stat, a read
# and an unlink through a ringfs mount, and how many requests reach the servers:
#   scripts/fuse-requests.sh RINGFS_BINARY [FILES]        (default 2000; needs root: tracefs)
# Starts a 2-server cluster of RINGFS_BINARY and its mount; per phase, counts the mount's
# `fuse_request_send` trace events by opcode (per file), the servers' request counters
# (`ringfs status`, server-to-server requests included) and the time per file (traced).
# docs/PERFORMANCE.md ("FUSE mount: metadata") has the figures.
set -euo pipefail
ringfs=$(realpath "$1")
files=${2:-2000}
tracing=/sys/kernel/tracing
mountpoint -q "$tracing" || mount -t tracefs nodev "$tracing"
work=$(mktemp -d /tmp/ringfs-fuse-requests-XXXXXX)
# (START_ARGS: more options for `ringfs start`, e.g. `--poll-us 0`.)
eval "$("$ringfs" start --servers 2 --run-dir "$work/run" ${START_ARGS:-} 2>/dev/null)"
mkdir "$work/mnt"
"$ringfs" mount "$work/mnt" > "$work/mount.log" 2>&1 &
mount_pid=$!
cleanup() {
    echo 0 > "$tracing/events/fuse/enable"
    kill "$mount_pid" 2>/dev/null || true
    wait "$mount_pid" 2>/dev/null || true
    "$ringfs" stop > /dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.1; done
connection=$(stat -c %d "$work/mnt")
# CPU time (user + system, ms) of the mount and of the servers together.
server_pids=$(awk '{ print $3 }' "$work/run/servers")
cpu_ms() { for pid in "$@"; do awk '{ print $14 + $15 }' "/proc/$pid/stat"; done | awk -v hz="$(getconf CLK_TCK)" '{ total += $1 } END { print total * 1000 / hz }'; }
server_requests() { "$ringfs" status 2>/dev/null | awk '$1 ~ /^server-/ { total += $(NF-1) } END { print total }'; }
for phase in create touch stat read unlink; do
    echo > "$tracing/trace"
    echo 1 > "$tracing/events/fuse/enable"
    before=$(server_requests)
    mount_cpu=$(cpu_ms "$mount_pid")
    servers_cpu=$(cpu_ms $server_pids)
    python3 - "$work/mnt/dir" "$phase" "$files" <<'PYTHON'
import os, sys, time
root, phase, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
started, cpu_before = time.perf_counter(), os.times()
if phase == "create":
    os.mkdir(root)
for index in range(count):
    path = f"{root}/f{index}"
    if phase == "create":
        descriptor = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        os.write(descriptor, b"x" * 3901)
        os.close(descriptor)
    elif phase == "touch":
        # (mdtest-easy's empty files, beside the others.)
        os.close(os.open(f"{path}.empty", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
    elif phase == "stat":
        os.stat(path)
    elif phase == "read":
        with open(path, "rb") as file:
            file.read()
    else:
        os.unlink(path)
elapsed, cpu_after = time.perf_counter() - started, os.times()
cpu = cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system
print(f"{phase}: {elapsed / count * 1e6:.0f} µs per file; CPU per file: the program {cpu / count * 1e6:.0f} µs", end="")
PYTHON
    echo ", the mount $(echo "$(cpu_ms "$mount_pid") $mount_cpu" | awk -v n="$files" '{ printf "%.0f", ($1 - $2) * 1000 / n }') µs, the servers $(echo "$(cpu_ms $server_pids) $servers_cpu" | awk -v n="$files" '{ printf "%.0f", ($1 - $2) * 1000 / n }') µs"
    after=$(server_requests)
    echo 0 > "$tracing/events/fuse/enable"
    echo "$phase: server requests per file: $(awk -v a="$after" -v b="$before" -v n="$files" 'BEGIN { printf "%.2f", (a - b) / n }')"
    # Per opcode: requests per file, and the time from the kernel's send to the daemon's
    # answer.
    python3 - "$tracing/trace" "$connection" "$files" <<'PYTHON'
import re, statistics, sys
trace, connection, files = sys.argv[1], sys.argv[2], int(sys.argv[3])
sent, sends, times = {}, {}, {}
for line in open(trace):
    found = re.search(r" ([0-9.]+): fuse_request_(send|end): connection (\d+) req (\d+)(?: opcode \d+ \((\w+)\))?", line)
    if not found or found.group(3) != connection:
        continue
    at, event, request, opcode = float(found.group(1)), found.group(2), found.group(4), found.group(5)
    if event == "send":
        sent[request] = (opcode, at)
        sends[opcode] = sends.get(opcode, 0) + 1
        times.setdefault(opcode, [])
    elif request in sent:
        opcode, since = sent.pop(request)
        times[opcode].append((at - since) * 1e6)
for opcode, count in sorted(sends.items(), key=lambda item: -item[1]):
    if count >= files / 100:
        spans = times[opcode]
        median = f"median {statistics.median(spans):.0f} µs, mean {statistics.mean(spans):.0f} µs" if spans else "no answer"
        print(f"    {opcode} {count / files:.2f} per file, {median}")
PYTHON
    # (The stat phase comes after the attributes of the create phase expired.)
    sleep 1.5
done
