#!/bin/bash
# Count FUSE requests per opcode (tracefs fuse:fuse_request_send) and /dev/fuse reads for a small 1-proc run.
HERE=$(cd "$(dirname "$0")" && pwd)
B=${PROBE:-/tmp/uring-probe}; MNT=$B/mnt; SRC=/dev/shm/uring-probe-src; TR=/sys/kernel/tracing
for mode in classic uring; do
  opts=""; [ $mode = uring ] && opts="-o io_uring"
  FUSE_INIT_STATUS=1 setsid $B/build/example/passthrough_hp --foreground --nocache --nopassthrough $opts $SRC $MNT > $B/hp_opmix_$mode.log 2>&1 </dev/null &
  DPID=$!; for i in $(seq 100); do grep -q " $MNT " /proc/self/mountinfo && break; sleep 0.1; done; sleep 0.5
  echo "== $mode pid=$DPID $(grep io_uring= $B/hp_opmix_$mode.log)"
  echo > $TR/trace; echo 1 > $TR/events/fuse/fuse_request_send/enable
  timeout 60 $HERE/mdbench $MNT 1 100 20 > /dev/null
  echo 0 > $TR/events/fuse/fuse_request_send/enable
  grep -o 'opcode [0-9]* ([A-Z_]*)' $TR/trace | sort | uniq -c | sort -rn | tr '\n' ';'; echo
  echo "# threads $(for t in /proc/$DPID/task/*; do awk -v c="$(cat $t/comm)" '{sub(/.*\) /,""); printf "%s:%d ", c, $12+$13}' $t/stat; done)"
  fusermount3 -u $MNT; for i in $(seq 100); do kill -0 $DPID 2>/dev/null || break; sleep 0.1; done; wait $DPID 2>/dev/null
done
echo > $TR/trace
