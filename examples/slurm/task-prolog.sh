#!/bin/sh
# Slurm TaskProlog for ringfs offered by the centre (see prolog.sh): runs as the job's user
# before every task, and for a job that asked for ringfs prints the `export` lines Slurm
# applies to the task's environment (RINGFS_SERVER, RINGFS_SECRET).
RINGFS_TMP=${RINGFS_TMP:-/tmp}
env_file=$RINGFS_TMP/ringfs-$(id -u)/slurm-$SLURM_JOB_ID-prolog/env
[ -r "$env_file" ] && cat "$env_file"
exit 0
