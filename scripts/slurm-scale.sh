#!/usr/bin/env bash
# ringfs's start-up and stop times in a Slurm job on N nodes (default 16) of a local Slurm
# cluster (scripts/local-slurm.sh: one slurmd per network namespace on this machine). Each
# repeat is one batch job over all nodes that times
#   srun        an empty step on every node (`srun true`): the baseline, what any step costs
#   start       `eval "$(ringfs start)"`: srun launches a server on every node, all joined
#   first byte  from the start until the batch node has written and read back one byte
#   all nodes   from the start until every node has written and read back its byte (srun)
#   stop        `ringfs stop`: servers shut down, every node cleaned and confirmed
# and checks that nothing is left on any node afterwards. Prints one line per job and the
# medians. Needs root and the packages scripts/setup.sh installs; not part of ./test.sh.
#
#   scripts/slurm-scale.sh [N] [REPEATS]      (RINGFS: the ringfs binary, default release)
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${1:-16}
repeats=${2:-3}
ringfs=${RINGFS:-$PWD/target/release/ringfs}
[ -x "$ringfs" ] || { echo "build it first: cargo build --release -p ringfs-cli (or set RINGFS)" >&2; exit 1; }
export RINGFS_SLURM_DIR=${RINGFS_SLURM_DIR:-/var/tmp/ringfs-slurm-scale}
export RINGFS_SLURM_TAG=${RINGFS_SLURM_TAG:-rfscale}
scripts/local-slurm.sh start "$nodes" >/dev/null
trap 'scripts/local-slurm.sh stop >/dev/null' EXIT
shared=$RINGFS_SLURM_DIR/shared

cat >"$shared/scale-job.sh" <<JOB
#!/bin/bash
set -euo pipefail
ms() { echo \$(( \$(date +%s%N) / 1000000 )); }
empty=\$(ms)
srun true
begin=\$(ms)
eval "\$($ringfs start)"
started=\$(ms)
printf x | $ringfs put /dev/stdin /first && [ "\$($ringfs cat /first)" = x ]
first=\$(ms)
srun sh -c 'printf y | $ringfs put /dev/stdin /node-\$SLURM_NODEID && [ "\$($ringfs cat /node-\$SLURM_NODEID)" = y ]'
all=\$(ms)
$ringfs stop
stopped=\$(ms)
echo "RESULT srun_ms=\$((begin - empty)) start_ms=\$((started - begin)) first_byte_ms=\$((first - begin)) all_nodes_ms=\$((all - begin)) stop_ms=\$((stopped - all))"
JOB
chmod +x "$shared/scale-job.sh"

median() { sort -n | awk '{ values[NR] = $1 } END { print values[int((NR + 1) / 2)] }'; }
results=()
for repeat in $(seq "$repeats"); do
    job=$(scripts/local-slurm.sh exec sbatch --parsable --nodes="$nodes" --ntasks-per-node=1 \
        --output="$shared/scale-$repeat.out" "$shared/scale-job.sh")
    while scripts/local-slurm.sh exec squeue -h -j "$job" 2>/dev/null | grep -q .; do sleep 0.5; done
    line=$(grep '^RESULT' "$shared/scale-$repeat.out" || { cat "$shared/scale-$repeat.out" >&2; exit 1; })
    left=$(find "$RINGFS_SLURM_DIR"/nodes/*/tmp -mindepth 1 | wc -l)
    echo "job $repeat on $nodes nodes: ${line#RESULT } left_behind=$left"
    [ "$left" = 0 ] || { echo "something was left behind on the nodes" >&2; exit 1; }
    results+=("${line#RESULT }")
done
for key in srun_ms start_ms first_byte_ms all_nodes_ms stop_ms; do
    value=$(printf '%s\n' "${results[@]}" | tr ' ' '\n' | sed -n "s/^$key=//p" | median)
    echo "median $key: $value"
done
