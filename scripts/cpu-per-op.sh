#!/usr/bin/env bash
# CPU time per metadata operation of several ringfs builds, in alternating rounds: each round
# starts a 2-server cluster per build (`--poll-us 0`: no polling, so CPU time is work, not
# spinning), runs `ringfs bench micro --use-running` (2 client processes, FILES creates,
# stats and removes each, 1 MiB of data), and reads the servers' CPU ticks from /proc and
# the clients' task-clock from `perf stat`. CPU time per operation hardly depends on how
# loaded the machine is, unlike rates: use it where the machine is shared.
#   scripts/cpu-per-op.sh NAME=BINARY... ; ROUNDS (default 5), FILES (default 4000), POLL (default 0)
rounds=${ROUNDS:-5}; files=${FILES:-4000}; poll=${POLL:-0}
out=$(mktemp /tmp/ringfs-cpu-per-op-XXXXXX)
ticks() { local t=0 p u s; for p in "$@"; do read u s < <(cut -d" " -f14,15 /proc/$p/stat); t=$((t + u + s)); done; echo $t; }
for round in $(seq $rounds); do
  for spec in "$@"; do
    name=${spec%%=*}; bin=${spec#*=}
    env=$($bin start --servers 2 --poll-us $poll 2>/dev/null) || { echo "start failed"; continue; }
    eval "$env"
    pids="$(cut -d" " -f2 $RINGFS_RUN_DIR/server-0.pid) $(cut -d" " -f2 $RINGFS_RUN_DIR/server-1.pid)"
    before=$(ticks $pids)
    perf stat -x, -e task-clock -o /tmp/cpo.perf env RINGFS_LOCAL=0 $bin bench micro --use-running --procs 2 --files $files --size 1M --repeats 1 --no-baseline --poll-us $poll > /tmp/cpo.out 2>&1
    after=$(ticks $pids)
    client_ms=$(grep task-clock /tmp/cpo.perf | cut -d, -f1)
    rates=$(grep -E "^(create|stat|remove) " /tmp/cpo.out | awk '{printf "%s=%s ", $1, $2}')
    echo "$name server_ticks=$((after - before)) client_ms=$client_ms $rates" >> $out
    $bin stop > /dev/null 2>&1
  done
done
python3 - $out $files <<'PY'
import re,statistics,sys
files=int(sys.argv[2]); ops=2*files*3
d={}
for l in open(sys.argv[1]):
    f=l.split(); name=f[0]; kv=dict(x.split('=') for x in f[1:])
    d.setdefault(name,[]).append((int(kv['server_ticks'])*10000/ops, float(kv['client_ms'])*1000/ops, float(kv.get('create',0))))
for name,v in d.items():
    s=[x[0] for x in v]; c=[x[1] for x in v]; r=[x[2] for x in v]
    print(f"{name:10} server µs/op {statistics.median(s):5.1f} ({min(s):.1f}-{max(s):.1f})  client µs/op {statistics.median(c):5.1f} ({min(c):.1f}-{max(c):.1f})  create k/s {statistics.median(r):.1f}")
PY
