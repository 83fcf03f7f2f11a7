#!/bin/bash
#SBATCH --job-name=ringfs-plain
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=4
#SBATCH --time=00:30:00
# A plain job on ringfs: stage the inputs in from the parallel file system, run an MPI
# program on ringfs across the nodes, stage the outputs out. ringfs lives and dies with the
# job: `ringfs run` starts one server per node of the allocation (one srun step beside the
# job's own), runs the script, and stops the servers and cleans every node afterwards — also
# after a failure, scancel or the time limit.
#
#   INPUT=$PWD/input OUTPUT=$PWD/output APP="$PWD/my_mpi_app /ringfs/input /ringfs/output" \
#       sbatch examples/slurm/plain-job.sh
#
# The ranks see ringfs under /ringfs through the LD_PRELOAD library: no FUSE needed on the
# compute nodes, unmodified programs. Add `--store dir:/local/nvme` to `ringfs run` to keep
# chunks on node-local SSDs instead of memory.
set -euo pipefail
export INPUT=${INPUT:-$SLURM_SUBMIT_DIR/input}      # a directory on the parallel file system
export OUTPUT=${OUTPUT:-$SLURM_SUBMIT_DIR/output}   # where the results go
export APP=${APP:-$SLURM_SUBMIT_DIR/my_mpi_app /ringfs/input /ringfs/output}
export MPI=${MPI:-pmi2}                             # srun --mpi: pmi2 (MPICH), pmix (Open MPI)
RINGFS=${RINGFS:-ringfs}

"$RINGFS" run --preload /ringfs -- bash -euo pipefail -c '
    cp -r "$INPUT" /ringfs/input                  # stage in
    mkdir -p /ringfs/output
    srun --mpi="$MPI" $APP                         # every rank reads and writes on ringfs
    mkdir -p "$OUTPUT"
    cp -r /ringfs/output/. "$OUTPUT"/             # stage out
'
echo "plain job done: $(ls "$OUTPUT" | wc -l) outputs in $OUTPUT"
