#!/usr/bin/env bash
# bench/w3ab-floor.sh — W3 (nbdcopy of the tar of real files onto a fresh peer) in interleaved
# A/B repetitions, for the adaptive codec's burst floor (issue 37 item 2): qemu-nbd on a raw
# file, `squeeze serve` with its defaults (burst floor raw), `squeeze serve --burst-floor lz4`
# (the old floor, same binary) and optionally a second binary (BEFORE, e.g. main's). Per copy:
# seconds, MB/s, the server process's CPU seconds per GB of the tar, du ratio right after
# the copy and, for squeeze peers, the engine's stats (bytes stored raw, per algorithm).
# With IDLE=1, the squeeze peers of the first repetition then stay idle IDLE_S seconds
# (default: 60 s per GB written) and the ratio is read again (the idle upgrade's work).
#
#   flock /tmp/bench.lock bench/w3ab-floor.sh BIN [BEFORE]
#
# The idle lines also give the idle squeeze's work (squeezed and still unsqueezed bytes, seconds).
# Env: REPS (5), TAR (/var/tmp/fc/w3.tar), SCR (/var/tmp/fc), IDLE (1), IDLE_S,
#      PEERS (default "raw sq sq-lz4", plus "before" with BEFORE), SQ_ARGS (extra `serve` options
#      of every squeeze peer, e.g. "--read-chunk 16K --recompress zstd:9").
# Output: one line per copy on stdout; run it under the bench lock (bench/README.md).
set -euo pipefail
BIN=$1
BEFORE=${2:-}
REPS=${REPS:-5}
TAR=${TAR:-/var/tmp/fc/w3.tar}
SCR=${SCR:-/var/tmp/fc}
IDLE=${IDLE:-1}
TAR_B=$(stat -c %s "$TAR")
IDLE_S=${IDLE_S:-$(((TAR_B * 60 + 999999999) / 1000000000))}
OPTS=(--flush -S 0 -C 1 -T 1 --request-size=1048576 -R 16)
cat "$TAR" >/dev/null
PEERS=${PEERS:-raw sq sq-lz4${BEFORE:+ before}}
read -r -a SQ_EXTRA <<<"${SQ_ARGS:-}"
echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) cores; tar $TAR_B bytes; bin $BIN; before ${BEFORE:-none}; squeeze args ${SQ_ARGS:-none}"
echo "peer rep seconds MB/s server_cpu_s cpu_s_per_GB du_ratio detail"

cpu_of() { awk '{print ($14+$15)/100}' "/proc/$1/stat"; }

for ((rep = 1; rep <= REPS; rep++)); do
  for peer in $PEERS; do
    d=$(mktemp -d "$SCR/w3ab.XXXX")
    case $peer in
      raw) truncate -s 3G "$d/img.raw"
           qemu-nbd -t -k "$d/nbd.sock" --cache=none --aio=native -f raw "$d/img.raw" >"$d/log" 2>&1 & ;;
      sq) "$BIN" serve --socket "$d/nbd.sock" --control "$d/ctl" --size 64G "${SQ_EXTRA[@]}" "$d/vol.sqz" >"$d/log" 2>&1 & ;;
      sq-lz4) "$BIN" serve --socket "$d/nbd.sock" --control "$d/ctl" --size 64G --burst-floor lz4 "${SQ_EXTRA[@]}" "$d/vol.sqz" >"$d/log" 2>&1 & ;;
      before) "$BEFORE" serve --socket "$d/nbd.sock" --control "$d/ctl" --size 64G "${SQ_EXTRA[@]}" "$d/vol.sqz" >"$d/log" 2>&1 & ;;
    esac
    pid=$!
    for ((i = 0; i < 200; i++)); do
      nbdinfo --size "nbd+unix:///?socket=$d/nbd.sock" >/dev/null 2>&1 && break
      sleep 0.1
    done
    c0=$(cpu_of $pid)
    t0=$(date +%s.%N)
    nbdcopy "${OPTS[@]}" "$TAR" "nbd+unix:///?socket=$d/nbd.sock"
    t1=$(date +%s.%N)
    c1=$(cpu_of $pid)
    du=$(du -sB1 "$d" | cut -f1)
    detail=""
    if [[ $peer != raw ]]; then
      b=$BIN; [[ $peer == before ]] && b=$BEFORE
      "$b" stats --json "$d/ctl" >"$d/stats0.json" 2>/dev/null || true
      detail=$(python3 -c '
import json,sys
s=next(iter(json.load(open(sys.argv[1])).values()))
print("live %.3f raw_stored %d below %d per_alg %s" % (s.get("compression_ratio",0), s.get("burst_raw_bytes",0), s.get("below_target_bytes",0), {k:v>>20 for k,v in s.get("bytes_per_algorithm",{}).items() if v}))
' "$d/stats0.json" 2>/dev/null || echo "(no stats)")
    fi
    python3 -c '
import sys
peer,rep,t0,t1,c0,c1,n,du=sys.argv[1:9]
s=float(t1)-float(t0); cpu=float(c1)-float(c0); n=int(n)
print("%s %s %.2f %.0f %.2f %.2f %.3f %s" % (peer, rep, s, n/s/1e6, cpu, cpu/(n/1e9), n/int(du), " ".join(sys.argv[9:])), flush=True)
' "$peer" "$rep" "$t0" "$t1" "$c0" "$c1" "$TAR_B" "$du" "$detail"
    if [[ $IDLE == 1 && $rep == 1 && $peer != raw ]]; then
      b=$BIN; [[ $peer == before ]] && b=$BEFORE
      for t in 10 30 $IDLE_S; do
        sleep $((t - ${last:-0})); last=$t
        du=$(du -sB1 "$d" | cut -f1)
        "$b" stats --json "$d/ctl" >"$d/stats.json" 2>/dev/null || true
        python3 -c '
import json,sys
peer,t,n,du,f=sys.argv[1:6]
s=next(iter(json.load(open(f)).values()))
print("  idle %s t=%ss du_ratio %.3f live %.3f pending %d upgraded %d raw_pending %d raw_upgraded %d upgrade_s %.1f squeezed %d unsqueezed %d squeeze_s %.1f" % (peer, t, int(n)/int(du), s.get("compression_ratio",0), s.get("below_target_pending_bytes",0), s.get("upgraded_bytes",0), s.get("burst_raw_pending_bytes",0), s.get("burst_raw_upgraded_bytes",0), s.get("upgrade_seconds",0), s.get("squeezed_bytes",0), s.get("unsqueezed_pending_bytes",0), s.get("squeeze_seconds",0)), flush=True)
' "$peer" "$t" "$TAR_B" "$du" "$d/stats.json"
      done
      unset last
    fi
    kill "$pid"; wait "$pid" 2>/dev/null || true
    rm -rf "$d"
  done
done
