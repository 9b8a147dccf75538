#!/usr/bin/env bash
# bench/rate_limited.sh — the adaptive codec's promise to a writer the CPU can keep up with
# (issue 16): "a client writing at a rate the CPU sustains gets the target codec inline".
#
#   bench/rate_limited.sh                       # FRACTIONS="0.5 0.75", SIZE=2g, REPS=1
#   FRACTIONS="0.5" REPS=3 bench/rate_limited.sh
#
# 1. What the CPU sustains: fio (ioengine=nbd, the W1 job: sequential 128 KiB writes at QD128,
#    buffer_compress_percentage=60, refilled per I/O) on a fresh `squeeze serve --no-adapt`,
#    where every blob is compressed with the target codec inline: its MB/s is the ceiling.
# 2. For each FRACTION: the same job with fio's --rate at FRACTION x that ceiling, on a fresh
#    `squeeze serve` with its defaults (adaptive codec on). From `squeeze stats --json` on the
#    server's control socket after the run (before any idle upgrade can run: the stats are taken
#    at once): bytes written, below_target_bytes, and so the share compressed inline with the
#    target codec = 1 - below_target / written. The target: at least 95% at FRACTION 0.5.
# One line per run on stdout and in OUT/results.jsonl (table: OUT/table.md); raw fio JSON, stats
# and server logs under OUT. The volumes are in a scratch directory under SCRATCH_BASE, removed
# at exit.
#
# Env: FRACTIONS ("0.5 0.75"), SIZE (2g: fio's size per run), REPS (1), OUT
#      (results/rate_limited-<time>), SCRATCH_BASE (/tmp), BENCH_LOCK (/tmp/bench.lock), SQUEEZE_SERVE_ARGS, BIN (a
#      squeeze binary to use instead of building one), CARGO_TARGET_DIR.
# Needs fio (with its nbd engine), flock, python3. The whole run holds the bench lock
# (bench/README.md).
set -euo pipefail

SQ_PROG=bench/rate_limited.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FRACTIONS=${FRACTIONS:-0.5 0.75}
SIZE=${SIZE:-2g}
REPS=${REPS:-1}

for t in fio flock python3; do command -v "$t" >/dev/null || sq_die "missing $t"; done
fio --enghelp 2>/dev/null | grep -qw nbd || sq_die "this fio has no nbd engine (Debian's fio has it)"
sq_lock
sq_bin
SCR=$(mktemp -d "${SCRATCH_BASE:-/tmp}/squeeze-rate.XXXXXX")
cleanup() { sq_serve_stop srv; rm -rf "$SCR"; }
sq_on_exit cleanup
sq_out rate_limited "$SCR"
cat "$OUT/machine.txt" >&2

stop() { sq_serve_stop srv; }

serve() { # serve DIR TAG [ARGS...]: a fresh server on DIR/nbd.sock, control socket DIR/vol.ctl
  local dir=$1 tag=$2
  shift 2
  rm -rf "$dir"
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  sq_serve_start srv "$OUT/$tag.server.log" --ready "$dir/nbd.sock" --ready "$dir/vol.ctl" -- \
    --socket "$dir/nbd.sock" --size 64G "$@" ${SQUEEZE_SERVE_ARGS:-} "$dir/vol.sqz"
}

job() { # job DIR RATE_KBPS(0 = none) TAG: the W1 write job against DIR's server
  local dir=$1 rate=$2 tag=$3
  local args=(--name=w1-write --ioengine=nbd "--uri=nbd+unix:///?socket=$dir/nbd.sock"
    --rw=write --bs=128k --iodepth=128 "--size=$SIZE" --buffer_compress_percentage=60
    --buffer_compress_chunk=4k --refill_buffers --randrepeat=1 --output-format=json)
  ((rate == 0)) || args+=("--rate=${rate}k")
  fio "${args[@]}" >"$OUT/$tag.fio.json" 2>"$OUT/$tag.fio.err" \
    || sq_die "fio $tag failed: $(tail -n3 "$OUT/$tag.fio.err")"
  "$BIN" stats --json "$dir/vol.ctl" >"$OUT/$tag.stats.json"
}

summary() { # summary TAG RATE_KBPS: one line from the fio JSON and the stats, and its JSON line
  python3 - "$OUT/$1.fio.json" "$OUT/$1.stats.json" "$1" "$2" <<'EOF'
import json, sys
fio_path, stats_path, tag, rate = sys.argv[1:5]
t = open(fio_path).read()
j, _ = json.JSONDecoder().raw_decode(t[t.index("{"):])  # fio may print warnings first
w = j["jobs"][0]["write"]
mbps = w["bw_bytes"] / 1e6
s = json.load(open(stats_path))
s = next(iter(s.values())) if "bytes_written" not in s else s
written, below = s["bytes_written"], s.get("below_target_bytes", 0)
inline = 1 - below / written if written else 0
print(f"{tag}\trate_limit_kBps={rate}\tMB/s={mbps:.1f}\twritten={written}\tbelow_target={below}"
      f"\tinline_target_share={inline:.4f}\tratio={s.get('compression_ratio', 0):.3f}")
print(json.dumps({"tag": tag, "rate_limit_kBps": int(rate), "MB/s": mbps, "written": written,
                  "below_target": below, "inline_target_share": inline,
                  "ratio": s.get("compression_ratio", 0)}))
EOF
}

for ((rep = 1; rep <= REPS; rep++)); do
  serve "$SCR/srv" "r$rep-ceiling" --no-adapt
  job "$SCR/srv" 0 "r$rep-ceiling"
  stop
  line=$(summary "r$rep-ceiling" 0 | sq_emit rep="$rep" fraction:=null)
  echo "$line"
  ceiling_kbps=$(python3 -c "import sys; print(int(float(sys.argv[1].split('MB/s=')[1].split()[0]) * 1000))" "$line")
  for f in $FRACTIONS; do
    rate=$(python3 -c "print(int($ceiling_kbps * $f))")
    serve "$SCR/srv" "r$rep-rate$f"
    job "$SCR/srv" "$rate" "r$rep-rate$f"
    stop
    summary "r$rep-rate$f" "$rate" | sq_emit rep="$rep" fraction="$f"
  done
done
sq_table
sq_log "results in $OUT (table.md, results.jsonl; raw fio JSON, stats, server logs)"
