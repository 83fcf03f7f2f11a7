#!/bin/sh
# Slurm Prolog for ringfs offered by the centre: a job that asks for it
# (`sbatch --constraint=ringfs`) finds ringfs running on all its nodes, and its environment
# set, without writing start or stop lines. Configure, on every node (slurm.conf):
#
#   Prolog=/etc/slurm/ringfs/prolog.sh       this script (root, every node, at job start)
#   PrologFlags=Alloc                        run it on every node when the job starts
#   TaskProlog=/etc/slurm/ringfs/task-prolog.sh   exports RINGFS_SERVER, RINGFS_SECRET
#   Epilog=/etc/slurm/ringfs/epilog.sh       stops the servers and cleans the node
#   NodeName=... Feature=ringfs              the nodes that offer it
#
# On each node this starts, as the job's user, the node's `ringfs node-agent` (the same
# agent `ringfs start` runs through srun): it runs the server, listening on port
# 7717 + job id mod 1000, the first node's server joined by the others, with its store and
# run directory under /tmp/ringfs-<uid>/slurm-<job>-prolog, and removes them when the epilog
# stops it. The job's secret is derived from a site key that only root can read, so that
# every node computes the same secret without talking to the others.
#
# Site settings (edit here; Slurm gives prologs a fixed environment):
RINGFS=${RINGFS:-ringfs}                            # the ringfs executable
RINGFS_SITE_KEY=${RINGFS_SITE_KEY:-/etc/ringfs/site.key}  # same on every node, mode 0400, root's
RINGFS_STORE=${RINGFS_STORE:-mem}                   # mem, or dir:PATH on node-local storage
RINGFS_TMP=${RINGFS_TMP:-/tmp}                      # where run directories live (task-prolog.sh too)
set -eu

case ",${SLURM_JOB_CONSTRAINTS:-}," in
*ringfs*) ;;
*) exit 0 ;;
esac
node=${SLURMD_NODENAME:-$(hostname)}
nodes=$(scontrol show hostnames "$SLURM_NODELIST")
first=$(printf '%s\n' "$nodes" | head -n 1)
count=$(printf '%s\n' "$nodes" | wc -l)
port=$((7717 + SLURM_JOB_ID % 1000))
secret=$({ printf 'ringfs-job-%s:' "$SLURM_JOB_ID"; cat "$RINGFS_SITE_KEY"; } | sha256sum | cut -d' ' -f1)
servers=$(printf '%s\n' "$nodes" | sed "s/\$/:$port/" | paste -sd, -)
run_dir=$RINGFS_TMP/ringfs-$SLURM_JOB_UID/slurm-$SLURM_JOB_ID-prolog

as_user() { setpriv --reuid="$SLURM_JOB_UID" --regid="$SLURM_JOB_GID" --init-groups "$@"; }
umask 077
as_user mkdir -p "$run_dir"
# What task-prolog.sh exports to every task of the job.
printf 'export RINGFS_SERVER=%s\nexport RINGFS_SECRET=%s\n' "$servers" "$secret" | as_user sh -c "cat > '$run_dir/env'"
# (A simple command, not the function: a background function would keep slurmd's output
# pipe open, and slurmd waits for it before it starts the job.)
RINGFS_SECRET=$secret setpriv --reuid="$SLURM_JOB_UID" --regid="$SLURM_JOB_GID" --init-groups \
    setsid "$RINGFS" node-agent --run-dir "$run_dir" --node "$node" --first "$first" --port "$port" \
    --store "$RINGFS_STORE" </dev/null >/dev/null 2>&1 &
# Slurm ends what is left of a prolog's process group when it exits: wait until the agent
# has left it (its own session) and its server listens.
waited=0
until [ -S "$run_dir/$node/server.sock" ]; do
    waited=$((waited + 1))
    if [ "$waited" -gt 600 ]; then
        echo "ringfs prolog: the server on $node did not start" >&2
        exit 1
    fi
    sleep 0.1
done
# The job starts once every node's prolog has ended: the first node's waits until all servers
# have joined, so that every client sees the whole cluster.
if [ "$node" = "$first" ]; then
    RINGFS_SERVER=$first:$port RINGFS_SECRET=$secret as_user "$RINGFS" status --wait-for "$count" --timeout-ms 60000 >/dev/null
fi
