#!/bin/bash
# Builds what the FUSE-over-io_uring probe needs (docs/PERFORMANCE.md, "FUSE over io_uring,
# measured with libfuse"): libfuse with io_uring support and its passthrough_hp example in
# $PROBE (default /tmp/uring-probe), and the benchmark (mdbench) beside this script.
# LIBFUSE_SRC: a checkout of github.com/libfuse/libfuse (3.18 or later).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PROBE=${PROBE:-/tmp/uring-probe}
: "${LIBFUSE_SRC:?set LIBFUSE_SRC to a libfuse checkout (3.18 or later)}"
apt-get install -y liburing-dev pkg-config ninja-build fuse3 gcc g++ python3-venv
mkdir -p "$PROBE/mnt"
python3 -m venv "$PROBE/venv" && "$PROBE/venv/bin/pip" install -q meson
"$PROBE/venv/bin/meson" setup "$PROBE/build" "$LIBFUSE_SRC" -Denable-io-uring=true -Dexamples=true -Dtests=false -Dutils=false
ninja -C "$PROBE/build" example/passthrough_hp
gcc -O2 -o "$HERE/mdbench" "$HERE/mdbench.c" -lpthread
echo "then: echo Y > /sys/module/fuse/parameters/enable_uring; ROUNDS=5 N=5000 T=30 $HERE/run.sh > raw.txt; python3 $HERE/analyze.py raw.txt; echo N > /sys/module/fuse/parameters/enable_uring"
