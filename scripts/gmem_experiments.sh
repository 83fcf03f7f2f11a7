#!/usr/bin/env bash
# The vGASNet report's two experiments on this machine (docs/PERFORMANCE.md, "Global memory
# caches"): the shared scan and the out-of-core stencil for 1-16 ranks, one server per rank,
# with an emulated SSD (50 MB/s, 100 us) and network (250 MB/s, 10 us per transfer, 5x the
# SSD as on the report's nodes). Writes CSV files and PNG charts into the directory given
# (default docs/img). Takes about 9 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/img}"
mkdir -p "$out"
cargo build --release --quiet -p ringfs-cli
ringfs=target/release/ringfs
base=(--servers 0 --gmem-ssd-mbps 50 --gmem-ssd-latency-us 100 --gmem-net-latency-us 10 --block-size 256K)
hardware=("${base[@]}" --gmem-net-mbps 250)
# Scan: a 32 MiB array, 1 MiB of DRAM per server (the array is 2x the DRAM of all 16
# servers, 32x that of one), 4 MiB of cache per rank.
scan_setups=no-cache,cache,cache+coop,cache+relay
"$ringfs" bench gmem scan "${hardware[@]}" --rank-counts 1,2,4,8,16 --setups "$scan_setups" \
    --array 32M --dram 1M --cache 4M --csv "$out/gmem-scan.csv" --png "$out/gmem-scan.png"
# The same scan with every device 5x slower (SSD 10 MB/s, link 50 MB/s: the same ratios):
# at 16 ranks the runs above keep this machine's 2 cores busy, these leave them mostly idle,
# so the emulated devices, not the CPU, set the pace.
"$ringfs" bench gmem scan --servers 0 --gmem-ssd-mbps 10 --gmem-ssd-latency-us 100 --gmem-net-latency-us 10 --block-size 256K \
    --gmem-net-mbps 50 --rank-counts 1,2,4,8,16 --setups "$scan_setups" \
    --array 32M --dram 1M --cache 4M --csv "$out/gmem-scan-slow.csv" --png "$out/gmem-scan-slow.png"
# The same scan with the network only twice as fast as the SSD: the homes' links limit
# the scan without cooperation sooner.
"$ringfs" bench gmem scan "${base[@]}" --gmem-net-mbps 100 --rank-counts 1,2,4,8,16 --setups "$scan_setups" \
    --array 32M --dram 1M --cache 4M --csv "$out/gmem-scan-net100.csv" --png "$out/gmem-scan-net100.png"
# Stencil: 1024 x 1024 f64 cells per rank and array (16 MiB of A and B per rank); each
# server's DRAM is a quarter of that and each rank's cache 4 MiB, so the arrays are twice
# the DRAM of all nodes. In DRAM: servers and caches hold everything.
stencil=(--rank-counts 1,2,4,8,16 --cols 1024 --rows 1024 --strip 64 --iterations 5 --out-of-core 4)
"$ringfs" bench gmem stencil "${hardware[@]}" "${stencil[@]}" --cache 4M \
    --csv "$out/gmem-stencil.csv" --png "$out/gmem-stencil.png"
# The same with caches that hold a rank's band (20 MiB): the arrays are still 4x the
# servers' DRAM, but each rank's working set stays in its cache.
"$ringfs" bench gmem stencil "${hardware[@]}" "${stencil[@]}" --cache 20M --setups no-cache,cache,cache+coop \
    --csv "$out/gmem-stencil-resident.csv" --png "$out/gmem-stencil-resident.png"
# The same with every device 5x slower (as for the scan): the CPU no longer sets the pace.
"$ringfs" bench gmem stencil --servers 0 --gmem-ssd-mbps 10 --gmem-ssd-latency-us 100 --gmem-net-latency-us 10 --block-size 256K \
    --gmem-net-mbps 50 "${stencil[@]}" --cache 20M --setups no-cache,cache,cache+coop,in-dram \
    --csv "$out/gmem-stencil-resident-slow.csv" --png "$out/gmem-stencil-resident-slow.png"
