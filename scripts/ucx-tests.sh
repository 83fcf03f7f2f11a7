#!/usr/bin/env bash
# Runs the end-to-end subset over UCX (docs/TESTING.md "Over UCX"): data, metadata, rename,
# failures and the global memory with every test cluster's servers on `--transport ucx` and
# no Unix socket, first over UCX's TCP transport, then over its shared-memory transports.
# ./test.sh runs it where UCX is installed. Exits non-zero if anything fails.
set -euo pipefail
# Loopback only (UCX's tcp transport also uses this host's other addresses unless told).
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
cd "$(dirname "$0")/.."
export RINGFS_TEST_TRANSPORT=ucx
for transports in tcp posix,sysv,cma,tcp; do
    echo "-- UCX_TLS=$transports"
    UCX_TLS=$transports cargo test --quiet --test core --test namespace --test rename_replace --test failures
    # One test at a time: each starts several rank processes that poll their UCX workers.
    UCX_TLS=$transports cargo test --quiet --test gmem -- --test-threads=1
done
