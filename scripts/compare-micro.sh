#!/usr/bin/env bash
# Compares the metadata rates of two ringfs builds: alternating rounds of `ringfs bench
# micro` with each, as root and (with ROUNDS_USER=1, the default) as an unprivileged user
# (uid 65534), then the median of each phase and the ratio new/old. Usage:
#   scripts/compare-micro.sh OLD/ringfs NEW/ringfs [rounds, default 5]
# Run it on a quiet machine: on a shared one the rounds vary by 2x and more.
set -euo pipefail
old="$1"; new="$2"; rounds="${3:-5}"
log=$(mktemp /tmp/ringfs-compare-XXXXXX)
run() {
    echo "== $1 $2"
    if [ "$2" = user ]; then
        setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp TMPDIR=/tmp \
            "$3" bench micro --repeats 3 --size 8M --files 10000 --no-baseline
    else
        "$3" bench micro --repeats 3 --size 8M --files 10000 --no-baseline
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
    rate = re.match(r'(create|stat|remove)\s+([\d.]+) k/s', line)
    if rate and current:
        data.setdefault(current + (rate.group(1),), []).append(float(rate.group(2)))
print("caller  phase    old k/s (range)        new k/s (range)        new/old")
for user in ("root", "user"):
    for phase in ("create", "stat", "remove"):
        old, new = data.get(("old", user, phase)), data.get(("new", user, phase))
        if old and new:
            print(f"{user:7} {phase:7} {statistics.median(old):6.1f} ({min(old):.0f}-{max(old):.0f})"
                  f"        {statistics.median(new):6.1f} ({min(new):.0f}-{max(new):.0f})"
                  f"        {statistics.median(new) / statistics.median(old):.2f}")
PY
echo "(log: $log)"
