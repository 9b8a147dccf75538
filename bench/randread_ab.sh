#!/usr/bin/env bash
# bench/randread_ab.sh — W1's 4 KiB random reads (issue 37 item 1) in interleaved A/B
# repetitions: qemu-nbd on a raw file, `squeeze serve` with its defaults (BIN) and optionally a
# second binary (BEFORE, e.g. main's). Per peer and repetition: a fresh volume, fio's W1 write of
# FIO_SIZE (128 KiB sequential, 60% compressible data, the shared harness's job file), then
# fio's W1 random read (4 KiB, QD32) for FIO_RT_RAND seconds. Per read: IOPS, the server
# process's CPU microseconds per read, and its voluntary context switches per read.
#
#   flock /tmp/bench.lock bench/randread_ab.sh BIN [BEFORE]
#
# With COLD=1 the page cache is dropped between the write and the reads (`echo 3 >
# /proc/sys/vm/drop_caches`), so the reads start from the disk: what a read that misses the cache
# costs when the reader first tries it itself.
#
# Env: REPS (3), FIO_SIZE (1g), FIO_RT_RAND (15), COLD (0), SCR (/var/tmp/fc), JOBS (../shared/bench),
#      PEERS ("raw sq" plus "before" with BEFORE), SQ_ARGS (extra `serve` options of every squeeze peer).
# Output: one line per run on stdout; run it under the bench lock (bench/README.md).
set -euo pipefail
BIN=$1
BEFORE=${2:-}
REPS=${REPS:-3}
SCR=${SCR:-/var/tmp/fc}
export FIO_SIZE=${FIO_SIZE:-1g} FIO_RT_RAND=${FIO_RT_RAND:-15} FIO_RT_SEQ=${FIO_RT_SEQ:-60}
export FIO_ENGINE=nbd FIO_DIRECT=0
# The shared harness's fio job files (../shared/bench beside the checkout).
JOBS=${JOBS:-$(dirname "${BASH_SOURCE[0]}")/../../shared/bench}
PEERS=${PEERS:-raw sq${BEFORE:+ before}}
read -r -a SQ_EXTRA <<<"${SQ_ARGS:-}"
mkdir -p "$SCR"
echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) cores; FIO_SIZE $FIO_SIZE, ${FIO_RT_RAND}s reads, cold ${COLD:-0}; bin $BIN; before ${BEFORE:-none}; squeeze args ${SQ_ARGS:-none}"
echo "peer rep iops server_us_per_read switches_per_read"

stat_of() { awk '{print ($14+$15)}' "/proc/$1/stat"; }
switches_of() { awk '/^voluntary_ctxt_switches/ {v=$2} /^nonvoluntary_ctxt_switches/ {n=$2} END {print v+n}' "/proc/$1/status"; }
# Context switches of every thread of the process.
all_switches() { local s=0 t; for t in /proc/$1/task/*; do s=$((s + $(switches_of "${t#/proc/}"))); done; echo $s; }

for ((rep = 1; rep <= REPS; rep++)); do
  for peer in $PEERS; do
    d=$(mktemp -d "$SCR/randread.XXXX")
    case $peer in
      raw) truncate -s 3G "$d/img.raw"
           qemu-nbd -t -k "$d/nbd.sock" --cache=none --aio=native -f raw "$d/img.raw" >"$d/log" 2>&1 & ;;
      sq) "$BIN" serve --socket "$d/nbd.sock" --size 64G "${SQ_EXTRA[@]}" "$d/vol.sqz" >"$d/log" 2>&1 & ;;
      before) "$BEFORE" serve --socket "$d/nbd.sock" --size 64G "${SQ_EXTRA[@]}" "$d/vol.sqz" >"$d/log" 2>&1 & ;;
    esac
    pid=$!
    trap 'kill $pid 2>/dev/null' EXIT
    for ((i = 0; i < 200; i++)); do
      nbdinfo --size "nbd+unix:///?socket=$d/nbd.sock" >/dev/null 2>&1 && break
      sleep 0.1
    done
    export FIO_TARGET="uri=nbd+unix:///?socket=$d/nbd.sock"
    fio "$JOBS/w1-write.fio" --output-format=terse >/dev/null
    if [[ ${COLD:-0} == 1 ]]; then
      sync
      echo 3 >/proc/sys/vm/drop_caches
    fi
    c0=$(stat_of $pid); s0=$(all_switches $pid)
    fio "$JOBS/w1-randread.fio" --output-format=json --output="$d/rr.json" >/dev/null
    iops=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["jobs"][0]["read"]["iops"]))' "$d/rr.json")
    c1=$(stat_of $pid); s1=$(all_switches $pid)
    python3 -c '
import sys, os
peer, rep, iops, c0, c1, s0, s1, rt = sys.argv[1:9]
reads = float(iops) * float(rt)
hz = os.sysconf("SC_CLK_TCK")
print("%s %s %s %.1f %.2f" % (peer, rep, iops, (int(c1) - int(c0)) / hz * 1e6 / reads, (int(s1) - int(s0)) / reads), flush=True)
' "$peer" "$rep" "$iops" "$c0" "$c1" "$s0" "$s1" "$FIO_RT_RAND"
    kill "$pid"; wait "$pid" 2>/dev/null || true
    rm -rf "$d"
  done
done
