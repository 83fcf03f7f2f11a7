#!/usr/bin/env bash
# fio (ioengine=psync) on ringfs through the LD_PRELOAD library, through the FUSE mount, and
# on /dev/shm, on one cluster, alternating rounds (docs/PERFORMANCE.md, LD_PRELOAD library).
#   scripts/fio-compare.sh [rounds, default 3]
# Prints, per job and target, the bandwidth (MiB/s) or IOPS of each round and the median.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
ringfs=target/release/ringfs
library=$PWD/target/release/libringfs_preload.so
mount=$(mktemp -d /tmp/ringfs-fio-mount-XXXXXX)
shm=$(mktemp -d /dev/shm/ringfs-fio-XXXXXX)
log=$(mktemp /tmp/ringfs-fio-XXXXXX)
eval "$($ringfs start --servers 2 --mount "$mount")"
trap '$ringfs stop >/dev/null 2>&1; rm -rf "$shm"; rmdir "$mount" 2>/dev/null || true' EXIT
# Each job: 2 processes, 256 MiB each; the reads read what the writes left.
jobs=(
    "seq-write --rw=write --bs=1m"
    "seq-read --rw=read --bs=1m"
    "rand-read-4k --rw=randread --bs=4k --runtime=5 --time_based"
    "rand-write-4k --rw=randwrite --bs=4k --runtime=5 --time_based"
)
run() { # target directory job...
    local target=$1 directory=$2; shift 2
    local prefix=()
    [ "$target" = preload ] && prefix=(env LD_PRELOAD="$library" RINGFS_MOUNT=/ringfs)
    "${prefix[@]}" fio --ioengine=psync --numjobs=2 --size=256m --group_reporting --output-format=terse \
        --terse-version=3 --directory="$directory" --filename_format='fio.$jobnum' "--name=$1" "${@:2}"
}
for round in $(seq "$rounds"); do
    for target in preload fuse shm; do
        case $target in
            preload) directory=/ringfs/fio ;;
            fuse) directory=$mount/fio-fuse ;;
            shm) directory=$shm ;;
        esac
        [ "$target" = preload ] && LD_PRELOAD="$library" RINGFS_MOUNT=/ringfs mkdir -p "$directory"
        [ "$target" != preload ] && mkdir -p "$directory"
        for job in "${jobs[@]}"; do
            # shellcheck disable=SC2086 # the job's options are words
            line=$(run "$target" "$directory" $job)
            echo "$round $target ${job%% *} $line" >> "$log"
        done
        [ "$target" = preload ] && LD_PRELOAD="$library" RINGFS_MOUNT=/ringfs rm -rf "$directory"
        [ "$target" != preload ] && rm -rf "${directory:?}"/fio.*
    done
done
python3 - "$log" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    round_, target, job, terse = line.split(" ", 3)
    fields = terse.strip().split(";")
    # terse v3: read bandwidth KiB/s at 6, read IOPS at 7; write bandwidth at 47, IOPS at 48.
    reading = "read" in job
    bandwidth, iops = (float(fields[6]), float(fields[7])) if reading else (float(fields[47]), float(fields[48]))
    value = iops / 1000 if "4k" in job else bandwidth / 1024
    rows.setdefault((job, target), []).append(value)
print(f"{'job':15} {'unit':6} {'preload':>22} {'FUSE':>22} {'/dev/shm':>22}  preload/FUSE  preload/shm")
for job in ("seq-write", "seq-read", "rand-read-4k", "rand-write-4k"):
    unit = "kIOPS" if "4k" in job else "MiB/s"
    cells, medians = [], {}
    for target in ("preload", "fuse", "shm"):
        values = rows.get((job, target), [])
        medians[target] = statistics.median(values) if values else float("nan")
        cells.append(f"{medians[target]:8.1f} ({'/'.join(f'{v:.0f}' for v in values)})")
    print(f"{job:15} {unit:6} {cells[0]:>22} {cells[1]:>22} {cells[2]:>22}  {medians['preload'] / medians['fuse']:11.2f}  {medians['preload'] / medians['shm']:10.2f}")
print(f"(log: {sys.argv[1]})")
PY
