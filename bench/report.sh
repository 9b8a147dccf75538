#!/usr/bin/env bash
# bench/report.sh — the benchmark report in one command: measure, then write the tables, the
# charts and the machine description into docs/benchmarks.md (between the lines
# `<!-- report:begin -->` and `<!-- report:end -->`) and docs/img/bench-*.svg.
#
#   sudo bench/report.sh                          # everything at the harness's defaults (~12 min)
#   REPS=2 sudo bench/report.sh                   # each harness run twice, to see the noise
#   FIO_SIZE=256m FIO_RT_SEQ=10 FIO_RT_RAND=5 sudo bench/report.sh   # a quick smoke run
#   REPORT_ONLY=results/report-<time> bench/report.sh   # only regenerate markdown + SVG (no root;
#                                                       # BIN, or the release build, draws the charts)
#
# Steps (progress on stderr; every raw output kept under OUT, default results/report-<time>):
#   1. check the tools ../shared/bench/run.sh needs; as root, apt-get install the missing ones
#      (INSTALL=0: only print the apt-get command); take the bench lock for the whole run
#      (bench/README.md); build the release binary (CARGO_TARGET_DIR, default target/) unless BIN
#      names one
#   2. OUT/machine.txt
#   3. one harness run (../shared/bench/run.sh): PEERS="nbd-raw nbd-qcow2-compress custom
#      btrfs-zstd1-force zram-lz4" (why this order: see REPORT_PEERS below), custom = `squeeze serve` with its default policy
#      -> OUT/peers/; then (MODE_NONE=1, the default) a second run, PEERS="nbd-raw custom"
#      with `squeeze serve --mode none` -> OUT/none/. Rows are compared within a run only.
#   4. the in-process engine bench: `squeeze bench --json --size 1G` (fio-like data) and
#      `squeeze bench --json --file $TAR` (the harness's W3 tar, whole), and
#      `squeeze scan --json --full $TAR` -> OUT/engine-fio.json, engine-tar.json, scan-tar.json
#   5. (SETTLE=1, the default) bench/settle.sh: W1 then W2 on a fresh `squeeze serve` as in the
#      harness, then no client I/O; the ratio (du and live) at SETTLE_TIMES seconds of idleness, as
#      the merger and cleaner catch up -> OUT/settle/settle.json (summary in settle.txt)
#   6. OUT/results.jsonl: the harness's CSV rows (with "pass"), the engine and scan JSON and
#      settle.sh's lines (with "step"), one JSON object a line
#   7. bench/report.py: markdown (also printed on stdout and kept as OUT/report.md and
#      OUT/table.md) and SVG (drawn by `$BIN chart` from report.py's JSON specs)
#
# Env: OUT (results/report-<time>; OUT_BASE is read as OUT), REPORT_ONLY (an existing OUT: step 7 only),
#      REPORT_PEERS (the first run's PEERS), MODE_NONE (1), ENGINE (1), SCAN (1), SETTLE (1),
#      ENGINE_SIZE (1G), SCAN_ARGS (--full; e.g. "--sample-mib 64" for a quicker scan),
#      SETTLE_TIMES ("0 5 10 20 30 60": idle seconds after W2 at which settle.sh samples),
#      SQUEEZE_SERVE_ARGS (extra `serve` options), DOC (docs/benchmarks.md), IMG_DIR (docs/img),
#      BIN, CARGO_TARGET_DIR, HARNESS, INSTALL (1), BENCH_LOCK (/tmp/bench.lock), SCRATCH_BASE (/tmp);
#      and every run.sh setting: REPS (1), FIO_SIZE (2g), FIO_RT_SEQ (30), FIO_RT_RAND (20),
#      TAR (~/.cache/squeeze-bench/usr.tar, built by run.sh on first use), DEV_SIZE, ...
# Exit status: 0 when every step ran (a peer failing inside the harness is a row, not an error).
set -euo pipefail

SQ_PROG=bench/report.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DOC=${DOC:-$SQ_ROOT/docs/benchmarks.md}
IMG_DIR=${IMG_DIR:-$SQ_ROOT/docs/img}

report() { # report OUT: report.md, also OUT/table.md and stdout
  sq_log "writing the report from $OUT into $DOC and $IMG_DIR"
  python3 "$SQ_ROOT/bench/report.py" "$OUT" --doc "$DOC" --img-dir "$IMG_DIR" --squeeze-bin "$BIN" \
    >"$OUT/report.md" || return
  sq_table - <"$OUT/report.md"
}

if [[ -n ${REPORT_ONLY:-} ]]; then
  [[ -d $REPORT_ONLY ]] || sq_die "REPORT_ONLY=$REPORT_ONLY is not a directory"
  OUT=$(readlink -f "$REPORT_ONLY")
  sq_bin # the charts are drawn by `squeeze chart`
  report
  exit 0
fi

[[ $(id -u) == 0 ]] || sq_die "run as root (the harness needs loop devices, mounts and zram); REPORT_ONLY=DIR does not"

OUT=${OUT:-${OUT_BASE:-}}
# Order matters on a VM: zram holds gigabytes of RAM and gives them back at teardown, and the
# host then reclaims that free memory (virtio-balloon free page reporting), so the next peer that
# writes through the page cache pays a first-touch fault per page (here dd of 1 GiB into a
# just-emptied cache: 461 MB/s, again right after: 4.2 GB/s). The qemu-nbd peers use
# cache=none (O_DIRECT) and never notice; squeeze and btrfs write through the page cache. So the
# default runs the O_DIRECT peers, then squeeze, then btrfs, then zram.
REPORT_PEERS=${REPORT_PEERS:-nbd-raw nbd-qcow2-compress custom btrfs-zstd1-force zram-lz4}
MODE_NONE=${MODE_NONE:-1}
ENGINE=${ENGINE:-1}
SCAN=${SCAN:-1}
SETTLE=${SETTLE:-1}
ENGINE_SIZE=${ENGINE_SIZE:-1G}
SCAN_ARGS=${SCAN_ARGS:---full}
SCRATCH_BASE=${SCRATCH_BASE:-/tmp}
TAR=${TAR:-${XDG_CACHE_HOME:-$HOME/.cache}/squeeze-bench/usr.tar}
export TAR SCRATCH_BASE

sq_need_tools
sq_lock
sq_bin

sq_out report "$SCRATCH_BASE"
{
  echo "out_base: $OUT"
  echo "settings: REPS=${REPS:-1} FIO_SIZE=${FIO_SIZE:-2g} FIO_RT_SEQ=${FIO_RT_SEQ:-30} FIO_RT_RAND=${FIO_RT_RAND:-20} ENGINE_SIZE=$ENGINE_SIZE SCAN_ARGS=$SCAN_ARGS"
  echo "serve_args: ${SQUEEZE_SERVE_ARGS:-}"
} >>"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

failed=()
step() { # step NAME COMMAND...: run, log a failure and go on
  local name=$1 rc=0
  shift
  "$@" || rc=$?
  if ((rc)); then
    sq_log "step '$name' failed (rc=$rc); continuing"
    failed+=("$name")
  fi
}

# 3. the harness runs
if [[ $REPORT_PEERS == *zram* && ! -e /sys/class/zram-control ]]; then
  modprobe zram 2>/dev/null || sq_log "modprobe zram failed; the zram peer may fail"
fi
step peers sq_run_pass "$OUT/peers" squeeze "$REPORT_PEERS"
if [[ $MODE_NONE == 1 ]]; then
  step none sq_run_pass "$OUT/none" squeeze-mode-none "nbd-raw custom" --mode none
fi

# 4. in-process engine bench and scan (under the bench lock, as everything here)
SCRATCH=$(mktemp -d "$SCRATCH_BASE/squeeze-report.XXXXXX")
rm_scratch() { rm -rf "$SCRATCH"; }
sq_on_exit rm_scratch
engine() { # engine NAME ARGS...
  local name=$1
  shift
  sq_log "squeeze bench --json $* -> $OUT/engine-$name.json"
  "$BIN" bench --json --dir "$SCRATCH" "$@" >"$OUT/engine-$name.json" 2>"$OUT/engine-$name.err"
}
scan() {
  sq_log "squeeze scan --json $SCAN_ARGS $TAR -> $OUT/scan-tar.json"
  # shellcheck disable=SC2086 # SCAN_ARGS is a list of options
  "$BIN" scan --json $SCAN_ARGS "$TAR" >"$OUT/scan-tar.json" 2>"$OUT/scan-tar.err"
}
if [[ $ENGINE == 1 ]]; then
  step engine-fio engine fio --size "$ENGINE_SIZE"
fi
if [[ ! -s $TAR ]]; then
  sq_log "no tar at $TAR (the harness builds it on its first run): no engine or scan run on real data"
  ((ENGINE == 0 && SCAN == 0)) || failed+=(tar)
else
  if [[ $ENGINE == 1 ]]; then step engine-tar engine tar --file "$TAR" --size "$(stat -c %s "$TAR")"; fi
  if [[ $SCAN == 1 ]]; then step scan scan; fi
fi

# 5. the ratio after W2 and after the clients go idle (reps, fio settings, serve args, scratch
# dir as above; BIN as built; it goes on under this run's hold of the bench lock: SQ_LOCKED=1)
settle() {
  sq_log "bench/settle.sh -> $OUT/settle/settle.json"
  OUT=$OUT/settle bash "$SQ_ROOT/bench/settle.sh" | tee "$OUT/settle.txt" >&2
}
if [[ $SETTLE == 1 ]]; then step settle settle; fi

# 6. results.jsonl: what steps 3-5 wrote, one JSON object a line
results() {
  local pass f
  for pass in peers none; do
    [[ ! -s $OUT/$pass/results.csv ]] \
      || python3 "$SQ_RESULTS_PY" from-csv "$OUT/$pass/results.csv" pass="$pass" | sq_result -
  done
  for f in "$OUT"/engine-*.json "$OUT"/scan-tar.json; do
    [[ ! -s $f ]] || python3 "$SQ_RESULTS_PY" from-json "$f" step="$(basename "$f" .json)" | sq_result -
  done
  [[ ! -s $OUT/settle/results.jsonl ]] || sq_result - step=settle <"$OUT/settle/results.jsonl"
}
step results results

# 7. the report
step report report
if ((${#failed[@]})); then
  sq_log "done with failures in: ${failed[*]}; raw outputs under $OUT"
  exit 1
fi
sq_log "done; raw outputs under $OUT; report in $DOC"
