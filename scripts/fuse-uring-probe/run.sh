#!/bin/bash
# usage: ROUNDS=5 N=5000 ./run.sh > raw.txt
HERE=$(cd "$(dirname "$0")" && pwd)
set -u
B=${PROBE:-/tmp/uring-probe}
SRC=/dev/shm/uring-probe-src
BASE=/dev/shm/uring-probe-base
MNT=$B/mnt
N=${N:-5000}; T=${T:-30}; ROUNDS=${ROUNDS:-5}
HP="$B/build/example/passthrough_hp --foreground --nocache --nopassthrough"
mkdir -p $SRC $BASE $MNT
mount_fs() {
  local mode=$1 opts=""
  case $mode in
    uring) opts="-o io_uring";;
    classic_t2) opts="--num-threads 2";;
    classic_single) opts="--single";;
  esac
  FUSE_INIT_STATUS=1 setsid $HP $opts $SRC $MNT > $B/hp_$mode.log 2>&1 < /dev/null &
  DPID=$!
  for i in $(seq 100); do grep -q " $MNT " /proc/self/mountinfo && break; sleep 0.1; done
  grep -q " $MNT " /proc/self/mountinfo || { echo "# mount failed $mode"; cat $B/hp_$mode.log; exit 1; }
  for i in $(seq 50); do grep -q 'io_uring=' $B/hp_$mode.log && break; sleep 0.1; done
  echo "# mounted $mode pid=$DPID comm=$(cat /proc/$DPID/comm) $(grep 'io_uring=' $B/hp_$mode.log)"
}
umount_fs() {
  echo "# threads $(for t in /proc/$DPID/task/*; do awk -v c="$(cat $t/comm)" '{sub(/.*\) /,""); printf "%s:%d ", c, $12+$13}' $t/stat; done)"
  fusermount3 -u $MNT
  for i in $(seq 100); do kill -0 $DPID 2>/dev/null || break; sleep 0.1; done
  kill -0 $DPID 2>/dev/null && { echo "# daemon $DPID still alive, TERM"; kill $DPID; }
  wait $DPID 2>/dev/null
}
bench() { # label dir pid
  for np in 1 2; do
    echo "# $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    DAEMON_PID=$3 timeout 600 $HERE/mdbench $2 $np $N $T | sed "s/^/$r $1 $np /"
  done
}
for r in $(seq $ROUNDS); do
  bench shm $BASE ""
  MODES=${MODES:-classic uring}
  # rotate the mode order each round (ABBA for two modes)
  set -- $MODES; k=$(( (r - 1) % $# )); order=$(echo $MODES | awk -v k=$k -v r=$r '{n=NF; for(i=0;i<n;i++){j=((i+k)%n)+1; if(n==2 && r%2==0) j=n-i; printf "%s ", $j}}')
  for m in $order; do
    mount_fs $m; bench $m $MNT $DPID; umount_fs
  done
done
echo "# end $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
