#!/usr/bin/env bash
# bench/dedup_inline.sh — dedup mode inline through NBD (issue 38): W1 (the harness's fio job,
# 128 KiB sequential writes, QD128, 60% compressible data refilled per I/O) on fresh volumes
# created with `--dedup off` and `--dedup inline`, alternating, PAIRS pairs in one run; then
# (W3=1) the W3 copy (nbdcopy of the harness's tar) once per mode, and (DEDUP_DATA=1)
# bench/dedup.sh's assembled image (three Debian roots and the W3 tar twice)
# copied with nbdcopy (bench/dedup.sh's options) onto a volume in each mode, with the bytes
# stored (du of the volume file) and the engine's dedup stats.
#
#   flock /tmp/bench.lock sudo BIN=target/release/squeeze bench/dedup_inline.sh
#   PAIRS=1 DEDUP_DATA=0 ...                 # W1 only, one pair
#   DD_MODES="inline inline:1 off" ...       # the dedup data with the sampled (default) and dense index
#
# A mode "inline:N" is mode inline served with `--dedup-sample N` (the inline index keeps 1
# fingerprint in N; 1 is dense; plain "inline" takes the server's default, 1 in 8). SAMPLE=N
# does the same for W1's and W3's inline runs.
# Env: BIN (the squeeze binary; required), PAIRS (3), FIO_SIZE (2g), FIO_RT_SEQ (30),
#      HARNESS_DIR (../shared/bench: w1-write.fio), DD_MODES ("inline off"), W3 (1), TAR (~/.cache/squeeze-bench/usr.tar), DISK (/var/tmp/dd-s24/disk.img: bench/dedup.sh's
#      image), DEDUP_DATA (1), SCRATCH_BASE (/var/tmp), OUT (results/dedup-inline-<time>).
# The caller holds the bench lock (flock): W1 is a throughput figure.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=${BIN:?set BIN to a release squeeze binary}
PAIRS=${PAIRS:-3}
HARNESS_DIR=${HARNESS_DIR:-$HERE/../../shared/bench}
[[ -e $HARNESS_DIR/w1-write.fio ]] || HARNESS_DIR=/work/shared/bench
DISK=${DISK:-/var/tmp/dd-s24/disk.img}
DEDUP_DATA=${DEDUP_DATA:-1}
W3=${W3:-1}
DD_MODES=${DD_MODES:-inline off}
TAR=${TAR:-$HOME/.cache/squeeze-bench/usr.tar}
OUT=${OUT:-$HERE/../results/dedup-inline-$(date -u +%Y%m%dT%H%M%SZ)}
export FIO_SIZE=${FIO_SIZE:-2g} FIO_RT_SEQ=${FIO_RT_SEQ:-30} FIO_RT_RAND=20
mkdir -p "$OUT"
SCR=$(mktemp -d "${SCRATCH_BASE:-/var/tmp}/squeeze-dedup-inline.XXXXXX")
PID=""
cleanup() {
  [[ -z $PID ]] || { kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null || true; }
  rm -rf "$SCR"
}
trap cleanup EXIT
log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
{ uname -r; nproc; uptime; git -C "$HERE" rev-parse --short HEAD; } >"$OUT/machine.txt" 2>&1

serve() { # serve DIR SIZE MODE[:SAMPLE] [serve args...]
  local d=$1 size=$2 mode=${3%%:*} sample=()
  [[ $3 != *:* ]] || sample=(--dedup-sample "${3#*:}")
  [[ $mode != inline || -z ${SAMPLE:-} || ${#sample[@]} -gt 0 ]] || sample=(--dedup-sample "$SAMPLE")
  shift 3
  mkdir -p "$d"
  "$BIN" create "$d/vol.sqz" --size "$size" --dedup "$mode" >/dev/null
  "$BIN" serve --socket "$d/nbd.sock" "${sample[@]}" "$@" "$d/vol.sqz" >"$d/serve.log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do [[ -S $d/nbd.sock ]] && return; sleep 0.1; done
  log "server did not come up: $(tail -n3 "$d/serve.log")"
  exit 1
}
stop() { kill "$PID"; wait "$PID" || true; PID=""; }
# The server's CPU seconds so far (user + system, from /proc/PID/stat).
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$PID/stat"; }
stats() { "$BIN" stats --json "$1/vol.ctl" 2>/dev/null || "$BIN" stats --json "$1/vol.sqz"; }

for rep in $(seq "$PAIRS"); do
  for mode in off inline; do
    d=$SCR/w1-$mode-$rep
    serve "$d" 3G "$mode"
    FIO_ENGINE=nbd FIO_DIRECT=0 FIO_TARGET="uri=nbd+unix:///?socket=$d/nbd.sock" \
      fio --output-format=json "$HARNESS_DIR/w1-write.fio" >"$OUT/w1-$mode-$rep.json"
    stats "$d" >"$OUT/w1-$mode-$rep-stats.json"
    cpu_s=$(cpu)
    stop
    # (fio's nbd engine prints a line before the JSON)
    mbps=$(python3 -c 'import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):]); print(round(j["jobs"][0]["write"]["bw_bytes"]/1e6,1))' "$OUT/w1-$mode-$rep.json")
    du=$(du -B1 "$d/vol.sqz" | cut -f1)
    echo "{\"workload\":\"W1\",\"mode\":\"$mode\",\"sample\":\"${SAMPLE:-}\",\"rep\":$rep,\"write_MBps\":$mbps,\"server_cpu_s\":$cpu_s,\"du_bytes\":$du}" | tee -a "$OUT/results.jsonl"
    rm -rf "$d"
  done
done

if ((DEDUP_DATA)); then
  [[ -s $DISK ]] || { log "no $DISK (bench/dedup.sh's image)"; exit 1; }
  size=$(stat -c %s "$DISK")
  for mode in $DD_MODES; do
    m=${mode/:/-}
    d=$SCR/dd-$m
    serve "$d" "$size" "$mode" --no-adapt
    t0=$(date +%s.%N)
    nbdcopy --flush -S 0 -C 1 -T 1 --request-size=1048576 -R 16 "$DISK" "nbd+unix:///?socket=$d/nbd.sock"
    t1=$(date +%s.%N)
    stats "$d" >"$OUT/dedup-data-$m-stats.json"
    cpu_s=$(cpu)
    stop
    du=$(du -B1 "$d/vol.sqz" | cut -f1)
    # The records a promotion replaced are garbage until the cleaner takes
    # them: `compact` (no --dedup) cleans and merges, as idle time would.
    "$BIN" compact --json "$d/vol.sqz" >"$OUT/dedup-data-$m-compact.json"
    du2=$(du -B1 "$d/vol.sqz" | cut -f1)
    echo "{\"workload\":\"dedup-data\",\"mode\":\"$mode\",\"sample\":\"${SAMPLE:-}\",\"seconds\":$(echo "$t1 - $t0" | bc),\"server_cpu_s\":$cpu_s,\"du_bytes\":$du,\"du_after_compact\":$du2}" | tee -a "$OUT/results.jsonl"
    rm -rf "$d"
  done
fi
if ((W3)); then
  [[ -s $TAR ]] || { log "no W3 tar $TAR"; exit 1; }
  tsize=$(stat -c %s "$TAR")
  for mode in off inline; do
    d=$SCR/w3-$mode
    serve "$d" $(((tsize >> 20) + 64))M "$mode"
    t0=$(date +%s.%N)
    nbdcopy --flush -S 0 -C 1 -T 1 --request-size=1048576 -R 16 "$TAR" "nbd+unix:///?socket=$d/nbd.sock"
    t1=$(date +%s.%N)
    stats "$d" >"$OUT/w3-$mode-stats.json"
    stop
    du=$(du -B1 "$d/vol.sqz" | cut -f1)
    echo "{\"workload\":\"W3\",\"mode\":\"$mode\",\"MBps\":$(echo "scale=1; $tsize / ($t1 - $t0) / 1000000" | bc),\"du_bytes\":$du}" | tee -a "$OUT/results.jsonl"
    rm -rf "$d"
  done
fi

log "results under $OUT"
