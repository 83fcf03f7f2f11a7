#!/usr/bin/env bash
# IO500 through the FUSE mount of two ringfs builds and on /dev/shm, in one run, alternating:
#   scripts/fuse-compare.sh [--rounds N] [--stonewall S] BEFORE_RINGFS AFTER_RINGFS [MOUNT_OPTIONS...]
# Each round: a 2-server cluster and a mount of BEFORE (its servers and its `ringfs mount`),
# `ringfs bench io500 --target fuse:MOUNT` (the harness of AFTER for all three), the same with
# AFTER (the two in turn first), then /dev/shm. MOUNT_OPTIONS go to both mounts. Prints every phase's median over the
# rounds for each target, AFTER / BEFORE and AFTER / /dev/shm; results stay in a temporary
# directory (printed). docs/PERFORMANCE.md ("FUSE mount: metadata") has the figures.
set -euo pipefail
rounds=3
stonewall=1
while [[ $# -gt 0 && $1 == --* ]]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --stonewall) stonewall=$2; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
before=$(realpath "$1")
after=$(realpath "$2")
shift 2
work=$(mktemp -d /tmp/ringfs-fuse-compare-XXXXXX)
echo "results in $work"

# Runs IO500 through a mount of `binary`'s cluster; results in $work/$label-$round.
through_mount() {
    local binary=$1 label=$2 round=$3
    local run=$work/run-$label-$round mount=$work/mnt-$label-$round
    mkdir -p "$mount"
    local environment
    environment=$("$binary" start --servers 2 --run-dir "$run" 2>/dev/null)
    (
        eval "$environment"
        "$binary" mount "$mount" "${@:4}" > "$run.mount.log" 2>&1 &
        local mount_pid=$!
        for _ in $(seq 200); do mountpoint -q "$mount" && break; sleep 0.05; done
        "$after" bench io500 --target "fuse:$mount" --stonewall "$stonewall" --warm-memory 0 --results "$work/$label-$round" > "$work/$label-$round.log" 2>&1 || echo "$label round $round failed (log: $work/$label-$round.log)"
        kill "$mount_pid"
        wait "$mount_pid" || true
        "$binary" stop > /dev/null 2>&1 || true
    )
}

for round in $(seq "$rounds"); do
    # (Alternating which build goes first, so that neither always runs on a warmer machine.)
    if (( round % 2 )); then
        through_mount "$before" before "$round" "$@"
        through_mount "$after" after "$round" "$@"
    else
        through_mount "$after" after "$round" "$@"
        through_mount "$before" before "$round" "$@"
    fi
    shm=/dev/shm/ringfs-fuse-compare-$$
    mkdir -p "$shm"
    "$after" bench io500 --target "posix:$shm" --stonewall "$stonewall" --warm-memory 0 --results "$work/shm-$round" > "$work/shm-$round.log" 2>&1 || echo "shm round $round failed"
    rm -rf "$shm"
    echo "round $round done"
done

python3 - "$work" "$rounds" <<'EOF'
import csv, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def medians(label):
    values, scores = {}, []
    for round in range(1, rounds + 1):
        try:
            rows = list(csv.DictReader(open(f"{work}/{label}-{round}/result.csv")))
        except OSError:
            continue
        for row in rows:
            values.setdefault(row["phase"], []).append(float(row["value"]))
    return {phase: statistics.median(v) for phase, v in values.items()}, values
before, before_all = medians("before")
after, after_all = medians("after")
shm, _ = medians("shm")
print(f"| phase | before (FUSE) | after (FUSE) | /dev/shm | after / before | after / shm |")
print(f"|---|---|---|---|---|---|")
for phase in shm:
    b, a, s = before.get(phase, 0), after.get(phase, 0), shm[phase]
    print(f"| {phase} | {b:.3f} | {a:.3f} | {s:.3f} | {a / b if b else 0:.2f} | {a / s if s else 0:.3f} |")
print("rounds (after):", {phase: [round(v, 2) for v in values] for phase, values in after_all.items()})
print("rounds (before):", {phase: [round(v, 2) for v in values] for phase, values in before_all.items()})
EOF
