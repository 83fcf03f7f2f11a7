#!/bin/bash
#SBATCH --job-name=ringfs-checkpoint
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --time=01:00:00
#SBATCH --signal=B:TERM@120
# A Python training job that checkpoints to ringfs in cache mode over a directory of the
# parallel file system: checkpoints are written at ringfs's speed and reach $PFS/ckpt in the
# background; a later job (after the time limit, a failure, a requeue) resumes from the
# latest one found there. Slurm's SIGTERM (here 120 s before the limit) reaches the tasks
# through `ringfs run` (the batch shell itself, by exec), which then flushes and stops
# ringfs on every node.
#
#   PFS=/lustre/$USER/train sbatch examples/slurm/checkpoint-job.sh      (again to resume)
set -euo pipefail
export PFS=${PFS:-$SLURM_SUBMIT_DIR/pfs}
export STEPS=${STEPS:-1000}
export TRAIN=${TRAIN:-$SLURM_SUBMIT_DIR/checkpoint.py}   # examples/slurm/checkpoint.py
mkdir -p "$PFS/ckpt"

# exec: the batch shell becomes `ringfs run`, so that Slurm's SIGTERM reaches it.
exec "${RINGFS:-ringfs}" run --backend "$PFS" --mount-path /pfs --preload /ringfs -- \
    srun python3 "$TRAIN" --dir /ringfs/pfs/ckpt --steps "$STEPS"
