#!/usr/bin/env bash
# Cache mode: what a rename of a flushed file costs. For each build given (label=path), in
# alternating rounds: a 2-server cluster over a scratch backend directory, a SIZE file put
# into ringfs and synced to the backend, then `ringfs mv` of it and a `ringfs sync`; the time
# of each. With FROM_BACKEND=1 the file is an input found in the backend (never read through
# ringfs) instead. Usage:
#   SIZE=256M [FROM_BACKEND=1] scripts/rename-cost.sh ROUNDS label=path [label=path ...]
set -eu
rounds=$1; shift
size=${SIZE:-256M}
scratch=$(mktemp -d /tmp/ringfs-rename-cost.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
head -c "$size" /dev/urandom > "$scratch/input"
now() { date +%s.%N; }
for round in $(seq "$rounds"); do
    for build in "$@"; do
        label=${build%%=*} binary=${build#*=}
        backend="$scratch/backend-$label"; rm -rf "$backend"; mkdir -p "$backend"
        if [ "${FROM_BACKEND:-0}" = 1 ]; then
            cp "$scratch/input" "$backend/big" && sync "$backend/big"
            eval "$("$binary" start --servers 2 --backend "$backend" --flush none --run-dir "$scratch/run-$label")"
        else
            eval "$("$binary" start --servers 2 --backend "$backend" --flush none --run-dir "$scratch/run-$label")"
            "$binary" put "$scratch/input" /big > /dev/null
            "$binary" sync
        fi
        start=$(now); "$binary" mv /big /renamed; mid=$(now); "$binary" sync; end=$(now)
        cmp -s "$scratch/input" "$backend/renamed" && same=yes || same=NO
        printf '%s round %s: mv %.3f s, sync after it %.3f s, backend file the same: %s\n' \
            "$label" "$round" "$(echo "$mid - $start" | bc)" "$(echo "$end - $mid" | bc)" "$same"
        "$binary" stop > /dev/null
    done
done
