#!/usr/bin/env bash
# Compares the metadata rates of two ringfs builds: alternating rounds of `ringfs bench
# micro` with each, as root and (with ROUNDS_USER=1, the default) as an unprivileged user
# (uid 65534), then the median of each phase and the ratio new/old. Usage:
#   scripts/compare-micro.sh OLD/ringfs NEW/ringfs [rounds, default 5]
# Run it on a quiet machine: on a shared one the rounds vary by 2x and more. MICRO_ARGS
# replaces the micro benchmark's arguments (default: metadata only, 8 MiB of data), e.g.
# MICRO_ARGS="--repeats 3 --no-baseline" for the bandwidth phases too.
set -euo pipefail
old="$1"; new="$2"; rounds="${3:-5}"
micro_args="${MICRO_ARGS:---repeats 3 --size 8M --files 10000 --no-baseline}"
log=$(mktemp /tmp/ringfs-compare-XXXXXX)
run() {
    echo "== $1 $2"
    if [ "$2" = user ]; then
        setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp TMPDIR=/tmp \
            "$3" bench micro $micro_args
    else
        "$3" bench micro $micro_args
    fi
}
for _ in $(seq "$rounds"); do
    for build in old new; do
        binary=$old; [ "$build" = new ] && binary=$new
        run "$build" root "$binary" >> "$log" 2>&1
        [ "${ROUNDS_USER:-1}" = 1 ] && run "$build" user "$binary" >> "$log" 2>&1
    done
done
python3 - "$log" <<'PY'
import re, statistics, sys
data, current = {}, None
for line in open(sys.argv[1]):
    header = re.match(r'== (\w+) (\w+)', line)
    if header:
        current = header.groups()
        continue
    rate = re.match(r'(create|stat|remove)\s+([\d.]+) k/s', line) or re.match(r'(write|read)\s+([\d.]+) GB/s', line)
    if rate and current:
        data.setdefault(current + (rate.group(1),), []).append(float(rate.group(2)))
print("caller  phase    old (range)            new (range)            new/old   (GB/s or k/s)")
for user in ("root", "user"):
    for phase in ("write", "read", "create", "stat", "remove"):
        old, new = data.get(("old", user, phase)), data.get(("new", user, phase))
        if old and new:
            print(f"{user:7} {phase:7} {statistics.median(old):6.1f} ({min(old):.0f}-{max(old):.0f})"
                  f"        {statistics.median(new):6.1f} ({min(new):.0f}-{max(new):.0f})"
                  f"        {statistics.median(new) / statistics.median(old):.2f}")
PY
echo "(log: $log)"
