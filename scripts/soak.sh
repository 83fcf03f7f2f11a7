#!/usr/bin/env bash
# Soak: runs the fault-searching tests again and again with new seeds until the time is up,
# and stops at the first failure (its seed and log are kept). Usage:
#   scripts/soak.sh [minutes]        (default 60)
# Each round: the in-process simulation (network faults), the relay fault test (partitions,
# pauses, SIGSTOP, kill+restart, 30 faults), the same workload with servers in network
# namespaces (30 cuts of veth links, SIGSTOP, kill+restart), the randomized concurrent
# namespace test, namespace operations and truncates cut short by killed servers (`failures.rs`),
# and the cache-mode suite (its random renames and kills with a new seed; running beside
# other work, it found flushes racing renames that a quiet machine never shows), and the
# global memory's eviction storms (one more seed each round) and relayed batches of reads,
# 20 new seeds of the seeded interleavings of namespace operations (ringfs-server's
# `seeded_interleavings`: a failing seed replays its order of steps exactly), and the FUSE
# mount's mixed load (8 workers renaming, overwriting, reading, unlinking and listing through
# one mount; RINGFS_SOAK_MOUNT_SECS long, default 180; every other round through the kernel's
# io_uring queues, `ringfs mount --io-uring`, where root can switch them on; also with reads
# under locks and through memory maps; files published by a rename through one mount, read
# through another that lists them), the random namespace operations in turns on two mounts
# (three new seeds each round) and at once on both, the advisory-lock tests (waits, signals, grants beside
# reads, a counter under locks from two mounts), and both protocol fuzzers: the
# request-handling fuzzer (RINGFS_SOAK_FUZZ_REQUESTS mutated requests per test, default
# 20,000) and the decoder fuzzer (1,000,000 mutated bodies).
# The summary line at the end is what docs/TESTING.md records.
# RINGFS_SOAK_HEAL_SECS (default 35, the documented bound: locks of a lost operation lapse
# after 30 s) is how soon the simulated cluster must work again after the faults; 5 finds
# slow heals that are not wrong.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tools the tests run (rsync, fio, …), as ./test.sh installs them.
source scripts/setup.sh
minutes=${1:-60}
end=$(( $(date +%s) + minutes * 60 ))
log_dir=$(mktemp -d /tmp/ringfs-soak-XXXXXX)
cargo build -p ringfs-cli --tests --quiet
cargo test -p ringfs-proto --lib --no-run --quiet
fuzz_requests=${RINGFS_SOAK_FUZZ_REQUESTS:-20000}
rounds=0
heal=${RINGFS_SOAK_HEAL_SECS:-35}
# Time bounds of the relay test doubled: a soak usually runs niced beside other work.
slack=${RINGFS_FAULT_SLACK:-2}
seed=$(( $(date +%s) % 100000 ))
mount_secs=${RINGFS_SOAK_MOUNT_SECS:-180}
uring_parameter=/sys/module/fuse/parameters/enable_uring
uring_rounds=0
if [ -w "$uring_parameter" ]; then
    uring_before=$(cat "$uring_parameter")
    trap 'echo "$uring_before" > "$uring_parameter"' EXIT
    echo Y > "$uring_parameter"
    uring_rounds=1
fi
while [ "$(date +%s)" -lt "$end" ]; do
    seed=$((seed + 1))
    for test in "simulation" "faults reads_stay_whole" "namespace concurrent_mixed" "failures namespace_operations_cut_short a_truncate" "cache" "gmem eviction_storms" "gmem reads_meeting" "mount_load eight_workers files_renamed_over" "posix_mount in_turns at_once --include-ignored" "locks" "fuzz_server" "proto fuzz"; do
        # ("faults reads_stay_whole" runs both the relay test and the network-namespace one;
        # "proto fuzz" is the decoder fuzzer, a unit test of ringfs-proto.)
        name=${test%% *}
        filter=${test#"$name"}
        target=(-p ringfs-cli --test "$name")
        [ "$name" = proto ] && target=(-p ringfs-proto --lib)
        if ! RINGFS_FUSE_IO_URING=$(( uring_rounds && seed % 2 )) RINGFS_GMEM_STORM_SEEDS=$seed-$seed RINGFS_SIM_SEED=$seed RINGFS_SIM_HEAL_SECS=$heal RINGFS_FAULT_SEED=$seed RINGFS_FAULT_SLACK=$slack RINGFS_FAULTS=30 RINGFS_TEST_SEED=$seed RINGFS_MOUNT_LOAD_SECS=$mount_secs \
            RINGFS_FUZZ_SEED=$seed RINGFS_FUZZ_REQUESTS=$fuzz_requests RINGFS_FUZZ_SECS=900 \
            cargo test "${target[@]}" --quiet -- $filter > "$log_dir/$name-$seed.log" 2>&1; then
            echo "FAILED: $name with seed $seed after $rounds rounds (log: $log_dir/$name-$seed.log)"
            exit 1
        fi
    done
    schedule_seeds="$((seed * 20))-$((seed * 20 + 19))"
    if ! RINGFS_SCHEDULE_SEEDS=$schedule_seeds cargo test -p ringfs-server --quiet --lib seeded_interleavings > "$log_dir/interleavings-$seed.log" 2>&1; then
        echo "FAILED: seeded interleavings with seeds $schedule_seeds after $rounds rounds (log: $log_dir/interleavings-$seed.log)"
        exit 1
    fi
    rounds=$((rounds + 1))
done
echo "soak: heal bound ${heal} s, $rounds rounds in $minutes minutes, seeds $((seed - rounds + 1))..$seed, no failure (logs: $log_dir)"
