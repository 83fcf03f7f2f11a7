#!/usr/bin/env bash
# The measurements a 2-core machine cannot make, as one bounded run for a borrowed many-core
# machine (docs/PERFORMANCE.md, "On a quiet 16-core machine"). Each section writes OUT/NAME.txt
# and is cut off after its time limit; the ringfs processes and FUSE mounts a section leaves
# behind are stopped (by PID) before the next. Usage:
#   OUT=DIR BEFORE=ringfs-of-the-older-build AFTER=ringfs-of-the-newer-build \
#     [LINGER=ringfs-of-wave/linger] [UCX_DIR=dir with lib/ and bin/ of UCX] \
#     scripts/measure-many-cores.sh [SECTION...]
# Sections (default all, in this order): probe micro linger ucx gmem32 fuse compare.
#   micro    `ringfs bench micro`, BEFORE and AFTER in alternating rounds (scripts/compare-micro.sh)
#   linger   the same, AFTER against LINGER (metadata only)
#   ucx      scripts/ucx-anchor.sh against AFTER (ucx_perftest as the anchor), one round
#   gmem32   the global memory's shared scan at 16 and 32 ranks and stencil at 32 ranks, slow devices
#   fuse     IO500 through the FUSE mount, BEFORE and AFTER and /dev/shm (scripts/fuse-compare.sh)
#   compare  `ringfs bench compare` (IO500 on ringfs and /dev/shm), BEFORE and AFTER alternating
#            (COMPARE_BUILDS="label=path ..." for other builds, COMPARE_ROUNDS rounds, default 2)
set -u
cd "$(dirname "$0")/.."
: "${OUT:?OUT names the directory for the results}" "${BEFORE:?}" "${AFTER:?}"
if [ -n "${UCX_DIR:-}" ]; then
    export PATH=$UCX_DIR/bin:$PATH LD_LIBRARY_PATH=$UCX_DIR/lib
fi
ulimit -n 65536 2> /dev/null || true
start=$(date +%s)
stamp() { echo "## $(($(date +%s) - start)) s: $*"; }

ringfs_pids() { ps -eo pid=,comm= | awk '$2 ~ /^ringfs/ {print $1}' | sort; }
# Stops the ringfs processes started since `before` was taken, and unmounts FUSE mounts.
stop_leftovers() {
    local before=$1 mount pid
    for mount in $(awk '$3 == "fuse" || $3 ~ /^fuse\./ {print $2}' /proc/mounts); do
        umount -l "$mount" 2> /dev/null
    done
    for pid in $(comm -13 <(echo "$before") <(ringfs_pids)); do kill -9 "$pid" 2> /dev/null; done
    sleep 1
}
section() { # NAME SECONDS COMMAND...
    local name=$1 seconds=$2 before
    shift 2
    before=$(ringfs_pids)
    {
        stamp "$name (limit $seconds s)"
        uptime
        timeout -k 5 "$seconds" "$@"
        echo "rc=$?"
        stamp "$name done"
    } > "$OUT/$name.txt" 2>&1
    stop_leftovers "$before"
}

probe() {
    nproc; uname -r; head -2 /etc/os-release; free -g | head -2
    ls -l /dev/fuse
    ucx_info -v 2> /dev/null | head -1
    "$AFTER" --version
}
gmem32() {
    local slow=(--servers 0 --gmem-ssd-mbps 10 --gmem-ssd-latency-us 100 --gmem-net-latency-us 10
        --block-size 256K --gmem-net-mbps 50)
    "$AFTER" bench gmem scan "${slow[@]}" --rank-counts 16,32 --setups no-cache,cache,cache+coop,cache+relay \
        --array 32M --dram 512K --cache 4M --csv /tmp/scan.csv && cat /tmp/scan.csv
    "$AFTER" bench gmem stencil "${slow[@]}" --rank-counts 32 --cols 1024 --rows 1024 --strip 64 \
        --iterations 5 --out-of-core 4 --cache 20M --setups no-cache,cache,cache+coop \
        --csv /tmp/stencil.csv && cat /tmp/stencil.csv
}
compare() {
    local round build
    for round in $(seq "${COMPARE_ROUNDS:-2}"); do
        for build in ${COMPARE_BUILDS:-BEFORE=$BEFORE AFTER=$AFTER}; do
            echo "== ${build%%=*} round $round"
            "${build#*=}" bench compare --stonewall 1 --warm-memory 0 --results "/tmp/compare-${build%%=*}-$round" 2>&1 |
                sed -n '/^phase /,/^score total/p'
        done
    done
}

export BEFORE AFTER COMPARE_BUILDS COMPARE_ROUNDS
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(probe micro linger ucx gmem32 fuse compare)
for name in "${sections[@]}"; do
    case $name in
        probe) section probe 20 bash -c "$(declare -f probe); probe" ;;
        micro) section micro 100 env ROUNDS_USER=0 MICRO_ARGS="--repeats 3 --size 64M --files 10000 --no-baseline" \
            scripts/compare-micro.sh "$BEFORE" "$AFTER" 4 ;;
        linger) section linger 65 env ROUNDS_USER=0 scripts/compare-micro.sh "$AFTER" "${LINGER:?}" 5 ;;
        ucx) section ucx 75 env RINGFS_BIN="$AFTER" scripts/ucx-anchor.sh 1 ;;
        gmem32) section gmem32 100 bash -c "$(declare -f gmem32); gmem32" ;;
        fuse) section fuse 110 scripts/fuse-compare.sh --rounds 2 --stonewall 1 "$BEFORE" "$AFTER" ;;
        compare) section compare "${COMPARE_LIMIT:-150}" bash -c "$(declare -f compare); compare" ;;
        *) echo "unknown section $name" >&2 ;;
    esac
done
stamp "all done"
