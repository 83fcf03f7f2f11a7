#!/usr/bin/env bash
# ringfs over UCX against its physical anchor, ucx_perftest, on the same UCX transports, and
# against ringfs over TCP, in one run (issue 28, item 4; docs/PERFORMANCE.md "ringfs over UCX
# against ucx_perftest"). Each round measures, alternating:
#   - ucx_perftest tag_lat (8 B, p50, one way) and tag_bw (1 MiB, overall MB/s; and with one
#     send in flight at a time, -O 1, as one ringfs client thread writes), and ucp_am_bw with
#     one send in flight and endpoints with peer error handling (-O 1 -e: active messages on
#     endpoints configured as ringfs's must be, which changes the transports UCX picks), for
#     UCX_TLS=tcp and for shared memory (posix,sysv,cma,tcp: ringfs needs tcp beside shared
#     memory to connect by socket address; perftest is given the same list);
#   - `ringfs bench rpc` against a one-server cluster started with --transport tcp, and with
#     --transport ucx under both UCX_TLS lists: the client's Ping round trip (median) and
#     1 MiB pwrite/pread bandwidth of one process, off the same-host path (RINGFS_LOCAL=0).
# Prints every round's numbers, then the medians over the rounds with the ratios.
# Usage: scripts/ucx-anchor.sh [ROUNDS]   (default 3)
#   RINGFS_BIN (default target/release/ringfs), PINGS (10000), SIZE (256M), REPEATS (3),
#   VARIANTS (default "tcp ucx-tcp ucx-shm"; the perftest rows follow the ucx ones),
#   BUILDS="before=/tmp/ringfs-old after=target/release/ringfs": several ringfs builds, each
#   measured in every round (before/after comparisons in the same run), instead of RINGFS_BIN.
# Run it under the build lock on a shared machine: flock /tmp/ringfs-cargo.lock scripts/ucx-anchor.sh
set -u
# Loopback only (UCX's tcp transport also uses this host's other addresses unless told).
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
builds=${BUILDS:-"=${RINGFS_BIN:-target/release/ringfs}"}
rounds=${1:-3}
pings=${PINGS:-10000}
size=${SIZE:-256M}
repeats=${REPEATS:-3}
variants=${VARIANTS:-"tcp ucx-tcp ucx-shm"}
shm=posix,sysv,cma,tcp
results=$(mktemp)
trap 'rm -f "$results"' EXIT

# ucx_perftest TLS TEST SIZE ITERATIONS FIELD [OPTION...]: one number of perftest's final line
# (its numbers: iterations, p50 µs, average µs, overall µs, average MB/s, overall MB/s, …).
perftest() {
  local tls=$1 test=$2 msg=$3 iterations=$4 field=$5 port server output tries
  shift 5
  port=$((20000 + RANDOM % 20000))
  UCX_TLS=$tls ucx_perftest -p "$port" > /dev/null 2>&1 &
  server=$!
  for tries in $(seq 100); do
    ss -ltn "sport = :$port" 2> /dev/null | grep -q LISTEN && break
    sleep 0.05
  done
  for tries in 1 2 3 4 5; do
    output=$(UCX_TLS=$tls timeout 120 ucx_perftest 127.0.0.1 -p "$port" -t "$test" -s "$msg" -n "$iterations" \
      -w $((iterations / 10)) "$@" 2>&1) && break
    sleep 0.2
  done
  kill "$server" 2> /dev/null
  wait "$server" 2> /dev/null
  echo "$output" | awk -v field="$field" '/^Final:/ { print $(field + 2) }'
}

# ringfs_rpc VARIANT: starts a one-server cluster for VARIANT, runs `ringfs bench rpc`
# against it, stops it; prints the bench's `key value` lines.
ringfs_rpc() {
  local variant=$1 bin=$2 transport tls environment
  case $variant in
    tcp) transport=tcp; tls=tcp ;;
    ucx-tcp) transport=ucx; tls=tcp ;;
    ucx-shm) transport=ucx; tls=$shm ;;
  esac
  # (Starting sometimes fails on a busy machine: one more try.)
  environment=$(UCX_TLS=$tls "$bin" start --servers 1 --transport "$transport" 2> /dev/null) ||
    environment=$(UCX_TLS=$tls "$bin" start --servers 1 --transport "$transport" 2>&1) || {
    echo "start failed: $environment" >&2
    return 1
  }
  (
    eval "$environment"
    UCX_TLS=$tls RINGFS_LOCAL=0 "$bin" bench rpc --pings "$pings" --size "$size" --repeats "$repeats"
    "$bin" stop > /dev/null 2>&1
  )
}

echo "ringfs over UCX against ucx_perftest: $rounds rounds, $(ucx_info -v 2> /dev/null | head -1)"
for round in $(seq "$rounds"); do
  for variant in $variants; do
    case $variant in
      ucx-tcp) tls=tcp ;;
      ucx-shm) tls=$shm ;;
      *) tls= ;;
    esac
    if [ -n "$tls" ]; then
      latency=$(perftest "$tls" tag_lat 8 20000 1)
      bandwidth=$(perftest "$tls" tag_bw 1048576 2000 5)
      # The same with one send in flight at a time, as one ringfs client thread's pwrite.
      one_at_a_time=$(perftest "$tls" tag_bw 1048576 2000 5 -O 1)
      echo "$variant perftest_lat_us $latency" >> "$results"
      echo "$variant perftest_bw_mb_s $bandwidth" >> "$results"
      echo "$variant perftest_bw1_mb_s $one_at_a_time" >> "$results"
      # Active messages, one at a time, on endpoints with error handling, as ringfs's.
      like_ringfs=$(perftest "$tls" ucp_am_bw 1048576 2000 5 -O 1 -e)
      echo "$variant perftest_am_bw1e_mb_s $like_ringfs" >> "$results"
    fi
    # The builds in a different order each round, so that none always runs first.
    set -- $builds
    shift $(((round - 1) % $#))
    for build in "$@" $(for early in $builds; do [ "$early" = "${1:-}" ] && break; echo "$early"; done); do
      label=${build%%=*}
      while read -r key value rest; do
        case $key in
          round_trip_us | write_mb_s | read_mb_s) echo "$variant $key:$label $value" >> "$results" ;;
          transport) echo "$variant transport $value $rest" >> "$results" ;;
        esac
      done < <(ringfs_rpc "$variant" "${build#*=}")
    done
    echo "== round $round $variant:" $(grep "^$variant " "$results" | grep -v transport | tail -n $((3 + 3 * $(wc -w <<< "$builds"))) | cut -d' ' -f2-)
  done
done

python3 - "$results" "$variants" "$builds" << 'EOF'
import statistics, sys
rows = {}
lanes = {}
for line in open(sys.argv[1]):
    words = line.split()
    if words[1] == "transport":
        lanes[words[0]] = " ".join(words[2:])
        continue
    rows.setdefault(words[0], {}).setdefault(words[1], []).append(float(words[2]))
def med(variant, key):
    values = rows.get(variant, {}).get(key)
    return statistics.median(values) if values else float("nan")
labels = [build.split("=", 1)[0] for build in sys.argv[3].split()]
variants = sys.argv[2].split()
print()
print("| variant | build | perftest round trip (2 × tag_lat p50) | ringfs Ping round trip | difference "
      "| perftest tag_bw 1 MiB | … one send at a time (-O 1) | ucp_am_bw -O 1 -e | ringfs write 1 MiB | ratio | ratio to -O 1 | ratio to am -e "
      "| ringfs read 1 MiB | ratio | ratio to am -e |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for variant in variants:
    anchor = "perftest_lat_us" in rows.get(variant, {})
    anchor_trip, anchor_bw = 2 * med(variant, "perftest_lat_us"), med(variant, "perftest_bw_mb_s")
    anchor_bw1 = med(variant, "perftest_bw1_mb_s")
    anchor_am = med(variant, "perftest_am_bw1e_mb_s")
    for label in labels:
        trip, write, read = med(variant, "round_trip_us:" + label), med(variant, "write_mb_s:" + label), med(variant, "read_mb_s:" + label)
        cells = [f"{variant} ({lanes.get(variant, '?')})", label or "–",
                 f"{anchor_trip:.2f} µs" if anchor else "–", f"{trip:.2f} µs",
                 f"{trip - anchor_trip:+.2f} µs" if anchor else "–",
                 f"{anchor_bw:.0f} MB/s" if anchor else "–",
                 f"{anchor_bw1:.0f} MB/s" if anchor else "–",
                 f"{anchor_am:.0f} MB/s" if anchor else "–",
                 f"{write:.0f} MB/s", f"{write / anchor_bw:.2f}×" if anchor else "–",
                 f"{write / anchor_bw1:.2f}×" if anchor else "–",
                 f"{write / anchor_am:.2f}×" if anchor else "–",
                 f"{read:.0f} MB/s", f"{read / anchor_bw:.2f}×" if anchor else "–",
                 f"{read / anchor_am:.2f}×" if anchor else "–"]
        print("| " + " | ".join(cells) + " |")
if "tcp" in rows:
    print()
    print("ringfs over UCX against ringfs over TCP (same run, same build):")
    for variant in variants:
        if variant == "tcp" or variant not in rows:
            continue
        for label in labels:
            ratio = lambda key: med(variant, f"{key}:{label}") / med("tcp", f"{key}:{label}")
            print(f"  {variant} {label}: round trip {ratio('round_trip_us'):.2f}× TCP's, "
                  f"write {ratio('write_mb_s'):.2f}×, read {ratio('read_mb_s'):.2f}×")
if len(labels) > 1:
    print()
    print(f"Against the first build ({labels[0]}):")
    for variant in variants:
        for label in labels[1:]:
            ratio = lambda key: med(variant, f"{key}:{label}") / med(variant, f"{key}:{labels[0]}")
            print(f"  {variant} {label}: round trip {ratio('round_trip_us'):.2f}×, write {ratio('write_mb_s'):.2f}×, read {ratio('read_mb_s'):.2f}×")
EOF
