#!/usr/bin/env bash
# bench/w3.sh — the W3 workload alone (nbdcopy of the harness's tar of real files onto a fresh
# peer, with the harness's nbdcopy options), for the adaptive write codec (issue 16): qemu-nbd on a
# raw file, `squeeze serve` with its defaults (adaptive codec) and `squeeze serve --no-adapt`
# (always the target codec), in alternating repetitions of one run; then, for each squeeze
# peer, the ratio of `du` (and the engine's live ratio) after SETTLE seconds of idleness, as the
# maintenance thread upgrades what was written below the target.
#
#   sudo bench/w3.sh                     # REPS=3, SETTLE="0 10 30 60"
#   REPS=1 SETTLE="0 5" sudo bench/w3.sh
#
# The whole run holds the bench lock (bench/README.md; the idle upgrade after each copy uses the
# CPU as much as the copy; W3_LOCKED=1, as SQ_LOCKED=1: the caller holds it already). Output: one
# line per copy on stdout (peer, seconds, MB/s, du bytes, du ratio) and per settle sample (du
# ratio, live ratio, below-target bytes, ...), each also a line of OUT/results.jsonl (tables in
# OUT/table.md); logs in OUT/PEER-REP/. The peers' files are in a scratch directory under
# SCRATCH_BASE (du counts each peer's directory there), removed at exit.
# Env: REPS (3), SETTLE ("0 10 30 60"), TAR (~/.cache/squeeze-bench/usr.tar), OUT
#      (results/w3-<time>), SCRATCH_BASE (/tmp), BENCH_LOCK (/tmp/bench.lock), PEERS ("raw squeeze squeeze-no-adapt"),
#      SQUEEZE_SERVE_ARGS (extra serve options), BIN (a squeeze binary instead of building one),
#      CARGO_TARGET_DIR.
set -euo pipefail

SQ_PROG=bench/w3.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REPS=${REPS:-3}
SETTLE=${SETTLE:-0 10 30 60}
TAR=${TAR:-${XDG_CACHE_HOME:-$HOME/.cache}/squeeze-bench/usr.tar}
PEERS=${PEERS:-raw squeeze squeeze-no-adapt}
NBDCOPY_OPTS=(--flush -S 0 -C 1 -T 1 --request-size=1048576 -R 16)

[[ $(id -u) == 0 ]] || sq_die "run as root (as the harness)"
[[ -s $TAR ]] || sq_die "no tar at $TAR (bench/report.sh or ../shared/bench/run.sh builds it)"
for t in qemu-nbd nbdcopy nbdinfo flock; do command -v "$t" >/dev/null || sq_die "missing $t"; done
[[ ${W3_LOCKED:-0} != 1 ]] || export SQ_LOCKED=1
sq_lock
sq_bin
SCR=$(mktemp -d "${SCRATCH_BASE:-/tmp}/squeeze-w3.XXXXXX")
PID=0
stop() { # stop PEER: its server
  if [[ $1 == raw ]]; then
    [[ $PID == 0 ]] || { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=0; }
  else
    sq_serve_stop "$1"
  fi
}
cleanup() { stop raw; sq_serve_stop_all; rm -rf "$SCR"; }
sq_on_exit cleanup
sq_out w3 "$SCR"
cat "$OUT/machine.txt" >&2
TAR_B=$(stat -c %s "$TAR")
cat "$TAR" >/dev/null

start() { # start PEER DIR: a fresh peer serving on DIR/nbd.sock
  local peer=$1 dir=$2 i
  rm -rf "$dir"; mkdir -p "$dir"
  # shellcheck disable=SC2086 # SQUEEZE_SERVE_ARGS is a list of options
  case $peer in
    raw) truncate -s 3G "$dir/img.raw"
         qemu-nbd -t -k "$dir/nbd.sock" --cache=none --aio=native -f raw "$dir/img.raw" >"$dir/server.log" 2>&1 &
         PID=$! ;;
    squeeze) sq_serve_start "$peer" "$dir/server.log" -- --socket "$dir/nbd.sock" --size 64G \
               ${SQUEEZE_SERVE_ARGS:-} "$dir/vol.sqz" ;;
    squeeze-no-adapt) sq_serve_start "$peer" "$dir/server.log" -- --socket "$dir/nbd.sock" --size 64G \
               --no-adapt ${SQUEEZE_SERVE_ARGS:-} "$dir/vol.sqz" ;;
    *) sq_die "unknown peer $peer" ;;
  esac
  for ((i = 0; i < 200; i++)); do
    nbdinfo --size "nbd+unix:///?socket=$dir/nbd.sock" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  sq_die "$peer did not come up: $(tail -n3 "$dir/server.log")"
}

echo "peer rep seconds MB/s du_bytes du_ratio"
for ((rep = 1; rep <= REPS; rep++)); do
  for peer in $PEERS; do
    dir=$SCR/$peer-$rep
    port=$((19000 + rep))
    if [[ $peer == squeeze* ]]; then
      SQUEEZE_SERVE_ARGS="${SQUEEZE_SERVE_ARGS:-} --metrics 127.0.0.1:$port"
    fi
    start "$peer" "$dir"
    t0=$(date +%s.%N)
    nbdcopy "${NBDCOPY_OPTS[@]}" "$TAR" "nbd+unix:///?socket=$dir/nbd.sock" 2>"$dir/nbdcopy.err"
    t1=$(date +%s.%N)
    du=$(du -sB1 "$dir" | cut -f1)
    python3 - "$peer" "$rep" "$t0" "$t1" "$TAR_B" "$du" <<'EOF' | sq_emit
import json, sys
peer, rep, t0, t1, n, du = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
print(f"{peer} {rep} {t1-t0:.2f} {n/(t1-t0)/1e6:.0f} {du} {n/du:.3f}", flush=True)
print(json.dumps({"peer": peer, "rep": int(rep), "seconds": t1 - t0, "MB/s": n / (t1 - t0) / 1e6,
                  "du_bytes": du, "du_ratio": n / du, "tar_bytes": n}))
EOF
    if [[ $peer == squeeze* ]]; then
      start_s=$(date +%s)
      for t in $SETTLE; do
        while (($(date +%s) - start_s < t)); do sleep 0.5; done
        du=$(du -sB1 "$dir" | cut -f1)
        curl -s "http://127.0.0.1:$port/stats" >"$dir/stats-$t.json" || true
        python3 - "$peer" "$rep" "$t" "$TAR_B" "$du" "$dir/stats-$t.json" <<'EOF' | sq_emit
import json, sys
peer, rep, t, n, du, f = sys.argv[1:7]
rec = {"peer": peer, "rep": int(rep), "settle_s": int(t), "du_bytes": int(du), "du_ratio": int(n) / int(du)}
try:
    s = json.load(open(f))
    s = next(iter(s["volumes"].values()))
    extra = (f"live_ratio {s.get('compression_ratio', 0):.3f} below_target {s.get('below_target_bytes', 0)} "
             f"pending {s.get('below_target_pending_bytes', 0)} upgraded {s.get('upgraded_bytes', 0)} "
             f"upgrade_s {s.get('upgrade_seconds', 0):.1f} per_alg {s.get('bytes_per_algorithm')}")
    rec.update(live_ratio=s.get("compression_ratio", 0), below_target=s.get("below_target_bytes", 0),
               pending=s.get("below_target_pending_bytes", 0), upgraded=s.get("upgraded_bytes", 0),
               upgrade_s=s.get("upgrade_seconds", 0), per_alg=s.get("bytes_per_algorithm"))
except Exception as e:
    extra = f"(no stats: {e})"
    rec.update(live_ratio=None, below_target=None, pending=None, upgraded=None, upgrade_s=None, per_alg=None)
print(f"  settle {peer} {rep} t={t}s du_ratio {int(n)/int(du):.3f} {extra}", flush=True)
print(json.dumps(rec))
EOF
      done
      SQUEEZE_SERVE_ARGS=${SQUEEZE_SERVE_ARGS% --metrics *}
    fi
    stop "$peer"
    rm -f "$dir"/img.raw "$dir"/vol.sqz
    mkdir -p "$OUT/$peer-$rep"
    find "$dir" -maxdepth 1 -type f -exec mv -t "$OUT/$peer-$rep/" {} +
    rm -rf "$dir"
  done
done
sq_table
sq_log "results in $OUT (table.md, results.jsonl; logs in PEER-REP/)"
