#!/usr/bin/env bash
# Builds ringfs and runs its demo: a local cluster on this machine, files written, read back
# and renamed through the native client, a short IO500 on the cluster and on /dev/shm, and a
# clean stop.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup.sh
cargo build --release --bin ringfs
exec target/release/ringfs demo "$@"
