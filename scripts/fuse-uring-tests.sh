#!/usr/bin/env bash
# The FUSE tests a second time with every mount taking the kernel's requests from its
# io_uring queues (`ringfs mount --io-uring`, crates/fuse/src/ring): each mount checks at
# its unmount that requests came through them. Needs root (it switches the `fuse` module's
# `enable_uring` on for the run and back after) and Linux 6.14 or later; says why and
# exits 0 where either is missing, unless RINGFS_REQUIRE_FUSE_URING=1.
set -euo pipefail
cd "$(dirname "$0")/.."
parameter=/sys/module/fuse/parameters/enable_uring
if [ ! -e "$parameter" ] || [ ! -w "$parameter" ] || [ ! -e /dev/fuse ]; then
    echo "note: FUSE over io_uring cannot be switched on here ($parameter missing or not writable); its test pass is skipped"
    [ "${RINGFS_REQUIRE_FUSE_URING:-}" != 1 ]
    exit
fi
before=$(cat "$parameter")
trap 'echo "$before" > "$parameter"' EXIT
echo Y > "$parameter"
RINGFS_FUSE_IO_URING=1 cargo test --quiet --test fuse --test locks --test mount_load --test rename_replace --test posix_mount --test permissions --test random_permissions "$@"
