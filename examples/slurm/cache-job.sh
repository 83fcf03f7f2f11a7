#!/bin/bash
#SBATCH --job-name=ringfs-cache
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:30:00
# ringfs as the job's cache of a directory of the parallel file system (PFS): inputs are read
# through from the PFS once (by the server that owns each chunk); outputs are written at
# ringfs's speed and flushed back by the servers while the job computes (I/O-aware: only
# while no I/O arrives), the rest when the job ends. When `ringfs run` returns, every output
# is in $PFS — no stage-out step.
#
#   PFS=/lustre/$USER/run42 sbatch examples/slurm/cache-job.sh
set -euo pipefail
export PFS=${PFS:-$SLURM_SUBMIT_DIR/pfs}   # the backend: the same path on every node
export RINGFS=${RINGFS:-ringfs}

"$RINGFS" run --backend "$PFS" --mount-path /pfs --preload /ringfs -- bash -euo pipefail -c '
    "$RINGFS" stagein /pfs/input           # optional: load the inputs ahead of use, in parallel
    mkdir -p /ringfs/pfs/output
    # Each task reads every input and writes its result; any program works on these paths.
    srun bash -c "cat /ringfs/pfs/input/* | sha256sum > /ringfs/pfs/output/sum-\$SLURM_PROCID"
'
echo "cache job done: $(ls "$PFS/output" | wc -l) outputs in $PFS/output"
