#!/bin/sh
# Slurm Epilog for ringfs (slurm.conf: Epilog=/path/to/epilog.sh): runs as root on every node
# of a job when the job ends, and removes what the job's ringfs clusters left on this node —
# servers and node agents still running (a node that was cut off, an agent killed after
# KillWait), run directories and `dir` stores under the temporary directory. Jobs that ended
# cleanly left nothing and this finds nothing.
#
# RINGFS names the ringfs executable (default: ringfs on PATH); TMPDIR the node's temporary
# directory if not /tmp. Never fails the node: what it could not remove is logged.
RINGFS=${RINGFS:-ringfs}
[ -n "${SLURM_JOB_ID:-}" ] || exit 0
report=$("$RINGFS" cleanup --job "$SLURM_JOB_ID" 2>&1) || true
if [ -n "$report" ] && command -v logger >/dev/null 2>&1; then
    printf '%s\n' "$report" | logger -t "ringfs-epilog[$SLURM_JOB_ID]"
fi
exit 0
