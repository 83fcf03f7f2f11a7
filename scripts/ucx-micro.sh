#!/usr/bin/env bash
# ringfs bench micro over a running cluster, TCP against UCX (UCX_TLS=tcp and shared memory),
# clients forced off the same-host path (RINGFS_LOCAL=0), alternating rounds. Usage:
#   scripts/ucx-micro.sh        (RINGFS_BIN: the ringfs binary, default target/release/ringfs)
set -u
# Loopback only (UCX's tcp transport also uses this host's other addresses unless told).
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
bin=${RINGFS_BIN:-target/release/ringfs}
args="--repeats 3 --size 64M --files 10000 --no-baseline --use-running"
for round in 1 2 3; do
  for variant in tcp ucx-tcp ucx-shm; do
    case $variant in
      tcp) transport=tcp; tls=tcp ;;
      ucx-tcp) transport=ucx; tls=tcp ;;
      ucx-shm) transport=ucx; tls=posix,sysv,cma,tcp ;;
    esac
    env=$(UCX_TLS=$tls $bin start --servers 2 --transport $transport 2>/dev/null) || { echo "start failed: $env"; continue; }
    eval "$env"
    echo "== $variant round $round"
    UCX_TLS=$tls RINGFS_LOCAL=0 $bin bench micro $args 2>&1 | grep -E "^(write|read|create|stat|remove) "
    $bin stop > /dev/null 2>&1
  done
done
