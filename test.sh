#!/usr/bin/env bash
# Runs every check of ringfs: formatting, lints, unit tests and the multi-process
# end-to-end tests (real servers on loopback, FUSE mounts, the C library, the Python package). Exits non-zero if
# anything fails.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup.sh
echo "== formatting"
cargo fmt --all -- --check
echo "== lints"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== build (including the C library the C tests link)"
cargo build --workspace --quiet
if [ -e /dev/fuse ]; then
    # This machine can mount FUSE: the FUSE tests must run, not skip.
    export RINGFS_REQUIRE_FUSE=1
else
    echo "note: /dev/fuse is missing here; the FUSE tests will report SKIPPED"
fi
probe="rfprobe$$"
if ip netns add "$probe" 2>/dev/null; then
    ip netns del "$probe"
    # Network namespaces can be made here: the tests with servers in them must run.
    export RINGFS_REQUIRE_NETNS=1
else
    echo "note: network namespaces cannot be made here (not root?); those fault tests will report skipped"
fi
if { command -v mpicc.mpich && command -v mpiexec.mpich; } >/dev/null 2>&1 || { command -v mpicc && command -v mpiexec; } >/dev/null 2>&1; then
    # An MPI is installed (scripts/setup.sh installs MPICH): the MPI-IO tests must run.
    export RINGFS_REQUIRE_MPI=1
else
    echo "note: MPICH is missing here; the MPI-IO test under the preload library will be skipped"
fi
if [ "${RINGFS_REQUIRE_NETNS:-}" = 1 ] && command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; then
    # Slurm and namespaces are there: the tests on a local Slurm cluster must run.
    export RINGFS_REQUIRE_SLURM=1
else
    echo "note: Slurm or network namespaces are missing here; tests/slurm.rs will report skipped"
fi
if [ -e /usr/include/ucp/api/ucp.h ] && command -v ucx_perftest >/dev/null 2>&1; then
    # UCX is installed (scripts/setup.sh): the UCX tests (crates/ucx) must run, not skip.
    export RINGFS_REQUIRE_UCX=1
    # The tests talk over loopback only: UCX's tcp transport would also open connections to
    # this host's other addresses (routed through lo all the same, but not 127.0.0.0/8).
    export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
else
    echo "note: UCX (libucx-dev, ucx-utils) is missing here; the UCX tests will report SKIPPED"
fi
echo "== unit and end-to-end tests"
cargo test --workspace --quiet
if [ "${RINGFS_REQUIRE_FUSE:-}" = 1 ] && [ -w /sys/module/fuse/parameters/enable_uring ]; then
    # Root on a kernel with FUSE over io_uring: the mount's ring server must pass the FUSE
    # tests too.
    export RINGFS_REQUIRE_FUSE_URING=1
fi
echo "== the FUSE tests again, through the kernel's io_uring queues (scripts/fuse-uring-tests.sh)"
scripts/fuse-uring-tests.sh
if [ "${RINGFS_REQUIRE_UCX:-}" = 1 ]; then
    echo "== the end-to-end subset over UCX (scripts/ucx-tests.sh)"
    scripts/ucx-tests.sh
fi
echo "== Python package (crates/python, built with maturin) and its pytest suite"
# PyTorch and its CUDA libraries take about 6 GB: say how much room there is, should it run out.
df -h . | tail -n 1 | awk '{print "note: " $4 " free on " $6 " before the Python packages"}'
# The debug builds made above: the extension reuses their artifacts, the tests run target/debug/ringfs.
RINGFS_PYTHON_PROFILE=debug scripts/python-test.sh
echo "== all tests passed"
