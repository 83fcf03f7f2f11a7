#!/usr/bin/env bash
# A real Slurm cluster on this machine, for tests and demonstrations: Debian's slurmctld and
# N slurmd (22.05, authenticated by munge), every daemon in namespaces of its own so that each
# node is a host of its own: its own network namespace (a veth pair to a bridge in a "switch"
# namespace), its own host name (UTS namespace), and its own mount namespace with a private
# /tmp and an /etc/hosts that names every node. The controller runs the same way as host
# "ctl"; commands such as sbatch, srun and squeue run there through `exec`.
#
#   scripts/local-slurm.sh start N      start the controller and nodes node1..nodeN; waits
#                                       until every node is idle
#   scripts/local-slurm.sh exec CMD...  run CMD on the controller host (SLURM_CONF set)
#   scripts/local-slurm.sh node I CMD...  run CMD on node I (its namespaces, its /tmp)
#   scripts/local-slurm.sh stop         end every process of the cluster (by PID: those in
#                                       its namespaces, and munged), delete the namespaces
#                                       and the state directory
#
# Directories under /tmp that every node should still see (a checkout cloned into /tmp, whose
# binaries the jobs run) are named, separated by colons, in $RINGFS_SLURM_SHARED_TMP at start:
# each node's /tmp then shows them at their usual paths, over an empty directory of the same
# name in the node's own /tmp.
#
# State lives in $RINGFS_SLURM_DIR (default /var/tmp/ringfs-slurm; not under /tmp, which
# every node replaces with its own) and the namespaces are named $RINGFS_SLURM_TAG-*
# (default rfsl; at most 8 characters), so several clusters can run side by side. Addresses
# are 10.202.0.0/24 inside those namespaces only: nothing is added to the root namespace.
# Needs root, iproute2, util-linux (unshare) and the packages slurmctld, slurmd,
# slurm-client and munge (scripts/setup.sh installs them).
set -euo pipefail

DIR=${RINGFS_SLURM_DIR:-/var/tmp/ringfs-slurm}
TAG=${RINGFS_SLURM_TAG:-rfsl}
SUBNET=10.202.0
# Seconds Slurm waits between SIGTERM and SIGKILL when it ends a job (scancel, time limit);
# ringfs's cleanup on a node must fit in it.
KILL_WAIT=${RINGFS_SLURM_KILL_WAIT:-20}

die() {
    echo "local-slurm: $*" >&2
    exit 1
}

node_ip() { echo "$SUBNET.$((10 + $1))"; }

# Runs a command in namespace NS with host name HOST, the cluster's /etc/hosts and, with a
# private TMP directory, that directory as /tmp. The command replaces the shell (exec), so
# the caller's $! is its process id.
in_host() {
    local ns=$1 host=$2 tmp=$3
    shift 3
    local setup="hostname $host && mount --bind $DIR/hosts /etc/hosts" kept shared
    if [ -n "$tmp" ]; then
        shared=$(tr ':' ' ' <"$DIR/shared-tmp")
        # The host's /tmp stays reachable under $DIR/host-tmp (in this mount namespace only)
        # for the directories that are shared. (Not recursive: mounts under /tmp, such as
        # other programs' FUSE mounts, stay out of the node.)
        [ -z "$shared" ] || setup="$setup && mount --bind /tmp $DIR/host-tmp"
        setup="$setup && mount --bind $tmp /tmp"
        for kept in $shared; do
            setup="$setup && mkdir -p $kept && mount --bind $DIR/host-tmp/${kept#/tmp/} $kept"
        done
    fi
    # (nsenter rather than `ip netns exec`, which mounts a new /sys without the cgroup file
    # systems slurmd needs.)
    nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private \
        sh -c "$setup && export SLURM_CONF=$DIR/slurm.conf && exec \"\$@\"" sh "$@"
}

make_network() {
    local nodes=$1 ns
    ip netns add "$TAG-sw"
    ip -n "$TAG-sw" link add br0 type bridge
    ip -n "$TAG-sw" link set br0 up
    # Host 0 is the controller, hosts 1..N the nodes.
    for host in $(seq 0 "$nodes"); do
        if [ "$host" = 0 ]; then ns="$TAG-ctl"; else ns="$TAG-n$host"; fi
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip -n "$ns" link add eth0 type veth peer name "$TAG-p$host" netns "$TAG-sw"
        ip -n "$ns" addr add "$(node_ip "$host")/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$TAG-sw" link set "$TAG-p$host" master br0 up
    done
}

write_config() {
    local nodes=$1
    {
        echo "127.0.0.1 localhost"
        echo "$(node_ip 0) ctl"
        for node in $(seq 1 "$nodes"); do echo "$(node_ip "$node") node$node"; done
    } >"$DIR/hosts"
    cat >"$DIR/slurm.conf" <<EOF
# Written by scripts/local-slurm.sh: $nodes nodes in network namespaces of this machine.
ClusterName=ringfs-local
SlurmctldHost=ctl($(node_ip 0))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/ctl/state
SlurmctldPidFile=$DIR/ctl/slurmctld.pid
SlurmctldLogFile=$DIR/ctl/slurmctld.log
SlurmdSpoolDir=$DIR/nodes/%n/spool
SlurmdPidFile=$DIR/nodes/%n/slurmd.pid
SlurmdLogFile=$DIR/nodes/%n/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
PropagateResourceLimits=NONE
ReturnToService=2
KillWait=$KILL_WAIT
InactiveLimit=0
MinJobAge=600
SlurmdTimeout=60
TmpFS=/tmp
EOF
    if [ -n "${RINGFS_SLURM_EXTRA_CONF:-}" ]; then
        printf '%s\n' "$RINGFS_SLURM_EXTRA_CONF" >>"$DIR/slurm.conf"
    fi
    for node in $(seq 1 "$nodes"); do
        echo "NodeName=node$node NodeAddr=$(node_ip "$node") CPUs=4 RealMemory=2000 Feature=ringfs State=UNKNOWN"
    done >>"$DIR/slurm.conf"
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$DIR/slurm.conf"
}

start_munge() {
    mkdir -p "$DIR/munge"
    chmod 700 "$DIR/munge"
    head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
    chmod 400 "$DIR/munge/munge.key"
    munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" \
        --seed-file="$DIR/munge/munged.seed" 2>"$DIR/munge/start.log" ||
        die "munged did not start: $(cat "$DIR/munge/start.log" "$DIR/munge/munged.log" 2>/dev/null)"
    for _ in $(seq 50); do
        [ -S "$DIR/munge/munge.socket" ] && return
        sleep 0.1
    done
    die "munged made no socket"
}

# Waits until every node is idle (sinfo on the controller host).
wait_until_idle() {
    local nodes=$1 idle=0
    for _ in $(seq 300); do
        idle=$(in_host "$TAG-ctl" ctl "" sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle' || true)
        [ "$idle" = "$nodes" ] && return
        sleep 0.2
    done
    in_host "$TAG-ctl" ctl "" sinfo -N >&2 || true
    tail -n 20 "$DIR/ctl/slurmctld.log" >&2 || true
    die "only $idle of $nodes nodes became idle within 60 s (logs in $DIR)"
}

start() {
    local nodes=${1:-}
    [[ "$nodes" =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 200 ] || die "usage: $0 start N (1 <= N <= 200)"
    [ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
    [ ${#TAG} -le 8 ] || die "RINGFS_SLURM_TAG must have at most 8 characters"
    for tool in ip unshare munged slurmctld slurmd sinfo; do
        command -v "$tool" >/dev/null || die "$tool is missing (scripts/setup.sh installs slurmctld, slurmd, slurm-client and munge)"
    done
    [ ! -e "$DIR/tag" ] || die "a cluster already runs in $DIR (stop it first)"
    mkdir -p "$DIR/ctl/state" "$DIR/shared" "$DIR/host-tmp"
    local kept
    for kept in $(tr ':' ' ' <<<"${RINGFS_SLURM_SHARED_TMP:-}"); do
        [[ "$kept" =~ ^/tmp/[A-Za-z0-9._/-]+$ && "$kept" != *..* && -d "$kept" ]] ||
            die "RINGFS_SLURM_SHARED_TMP: $kept is not a directory under /tmp"
    done
    printf '%s\n' "${RINGFS_SLURM_SHARED_TMP:-}" >"$DIR/shared-tmp"
    chmod 1777 "$DIR/shared"
    echo "$TAG" >"$DIR/tag"
    echo "$nodes" >"$DIR/node-count"
    # A start that fails half-way takes down what it made.
    trap 'echo "local-slurm: start failed; cleaning up" >&2; stop >&2' EXIT
    make_network "$nodes"
    write_config "$nodes"
    start_munge
    in_host "$TAG-ctl" ctl "" slurmctld -D -i >"$DIR/ctl/stdout.log" 2>&1 &
    echo $! >"$DIR/ctl/daemon.pid"
    for node in $(seq 1 "$nodes"); do
        mkdir -p "$DIR/nodes/node$node/spool" "$DIR/nodes/node$node/tmp"
        chmod 1777 "$DIR/nodes/node$node/tmp"
        in_host "$TAG-n$node" "node$node" "$DIR/nodes/node$node/tmp" slurmd -D >"$DIR/nodes/node$node/stdout.log" 2>&1 &
        echo $! >"$DIR/nodes/node$node/daemon.pid"
    done
    wait_until_idle "$nodes"
    trap - EXIT
    echo "local-slurm: $nodes nodes idle; run commands with: $0 exec sbatch ... (state in $DIR)"
}

# Ends every process in namespace NS: SIGTERM, then SIGKILL to those left after 5 s.
end_namespace() {
    local ns=$1 pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] || return 0
    kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 50); do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [ -n "$pids" ] || return 0
        sleep 0.1
    done
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
}

stop() {
    [ -e "$DIR/tag" ] || { echo "local-slurm: no cluster in $DIR"; return 0; }
    TAG=$(cat "$DIR/tag")
    local nodes
    nodes=$(cat "$DIR/node-count" 2>/dev/null || echo 0)
    for node in $(seq 1 "$nodes"); do end_namespace "$TAG-n$node"; done
    end_namespace "$TAG-ctl"
    local munged
    munged=$(cat "$DIR/munge/munged.pid" 2>/dev/null || true)
    if [ -n "$munged" ] && grep -q munged "/proc/$munged/cmdline" 2>/dev/null; then
        kill -TERM "$munged"
        for _ in $(seq 50); do [ -e "/proc/$munged" ] || break; sleep 0.1; done
    fi
    for ns in $(seq 1 "$nodes" | sed "s/^/$TAG-n/") "$TAG-ctl" "$TAG-sw"; do
        ip netns del "$ns" 2>/dev/null || true
    done
    # (--one-file-system: never into a mount, should one have leaked out of a node.)
    rm -rf --one-file-system "$DIR"
    echo "local-slurm: stopped"
}

case "${1:-}" in
start) start "${2:-}" ;;
stop) stop ;;
exec)
    shift
    [ -e "$DIR/tag" ] || die "no cluster in $DIR"
    TAG=$(cat "$DIR/tag")
    in_host "$TAG-ctl" ctl "" "$@"
    ;;
node)
    [ -e "$DIR/tag" ] || die "no cluster in $DIR"
    TAG=$(cat "$DIR/tag")
    node=${2:?usage: $0 node I CMD...}
    shift 2
    in_host "$TAG-n$node" "node$node" "$DIR/nodes/node$node/tmp" "$@"
    ;;
*) die "usage: $0 start N | exec CMD... | node I CMD... | stop" ;;
esac
