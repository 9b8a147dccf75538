#!/usr/bin/env bash
# bench/nbd.sh — `squeeze serve` against qemu-nbd, end to end over NBD, with the shared peer
# harness (../shared/bench/run.sh: read its header and README for the workloads and columns).
# For the whole report (these peers plus btrfs, zram, the in-process engine bench and scan,
# with tables and charts written into docs/benchmarks.md) use bench/report.sh.
#
#   sudo bench/nbd.sh                      # build release, run both passes, print both tables
#   FIO_SIZE=1g REPS=2 sudo bench/nbd.sh   # smaller / repeated (every run.sh setting passes through)
#
# Pass 1 ("compress"): PEERS="nbd-raw nbd-qcow2-compress custom", the custom peer being
#   `squeeze serve` with its default policy (zstd:3, aggressive, required ratio 0.875, blobs
#   4K-128K), so the raw qemu-nbd baseline, the compressing qcow2 and squeeze are measured in the
#   same run (issue 3's targets compare rows of one run only).
# Pass 2 ("none"): PEERS="nbd-raw custom" with squeeze created by serve with `--mode none`
#   (no codec, zero detection only), against a fresh qemu-nbd raw baseline in the same run.
# Optional passes (e.g. PASSES="compress none lz4"):
#   "lz4":  PEERS="nbd-raw custom" with squeeze on `--algorithm lz4` (the faster, lower-ratio codec);
#   "zstd1": PEERS="nbd-qcow2-compress custom" with squeeze on `--algorithm zstd:1 --max-blob 64K`
#           (the default before zstd:3 with 128K blobs: faster on real files, 5% less ratio).
#   "default": PEERS="nbd-raw custom" with squeeze's defaults (pass 1 without qcow2);
#   "floor-lz4": PEERS="nbd-raw custom" with `--burst-floor lz4` (the adaptive codec's old floor).
#
# Workloads (fio 3.33 ioengine=nbd, data 60% compressible per 4 KiB chunk, refilled per I/O):
#   W1 128k sequential write of FIO_SIZE at QD128, 128k sequential read QD128, 4k random read
#   QD32 for 20 s; W2 4k random write QD32 for 20 s over W1's data; W3 nbdcopy of a ~1 GiB tar of
#   /usr (real files) onto a fresh volume.
# Physical bytes of squeeze: `du` of its data dir (the sparse volume file), as for every peer.
#
# Env: SQUEEZE_SERVE_ARGS (extra `serve` options for every pass, e.g. "--workers 8"),
#      HARNESS (../shared/bench/run.sh), BIN (a squeeze binary instead of building one),
#      CARGO_TARGET_DIR (target), OUT (results/nbd-<time>; OUT_BASE is read as OUT),
#      PASSES ("compress none"), BENCH_LOCK (/tmp/bench.lock); plus run.sh's own
#      (REPS, FIO_SIZE, FIO_RT_SEQ, FIO_RT_RAND, ...). Needs root (run.sh requires it).
# The whole run holds the bench lock (bench/README.md).
# Output: each pass's CSV and markdown table under OUT/<pass>/ (run.sh's), every CSV row in
# OUT/results.jsonl (with "pass"), both tables on stdout and in OUT/table.md.
set -euo pipefail

SQ_PROG=bench/nbd.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

OUT=${OUT:-${OUT_BASE:-}}
PASSES=${PASSES:-compress none}

[[ $(id -u) == 0 ]] || sq_die "run.sh needs root"
for pass in $PASSES; do
  [[ $pass == @(compress|none|lz4|zstd1|default|floor-lz4) ]] ||
    sq_die "unknown pass $pass (compress, none, lz4, zstd1, default, floor-lz4)"
done
sq_need_tools
sq_lock
sq_bin

sq_out nbd "${SCRATCH_BASE:-/tmp}"
echo "serve args: ${SQUEEZE_SERVE_ARGS:-(none)}" >>"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

for pass in $PASSES; do
  case $pass in
    compress) sq_run_pass "$OUT/$pass" squeeze "nbd-raw nbd-qcow2-compress custom" ;;
    none) sq_run_pass "$OUT/$pass" squeeze-mode-none "nbd-raw custom" --mode none ;;
    lz4) sq_run_pass "$OUT/$pass" squeeze-lz4 "nbd-raw custom" --algorithm lz4 ;;
    default) sq_run_pass "$OUT/$pass" squeeze "nbd-raw custom" ;;
    floor-lz4) sq_run_pass "$OUT/$pass" squeeze-floor-lz4 "nbd-raw custom" --burst-floor lz4 ;;
    zstd1) sq_run_pass "$OUT/$pass" squeeze-zstd1-64k "nbd-qcow2-compress custom" --algorithm zstd:1 --max-blob 64K ;;
  esac
  python3 "$SQ_RESULTS_PY" from-csv "$OUT/$pass/results.csv" pass="$pass" | sq_result -
done

for pass in $PASSES; do
  echo
  echo "## pass $pass"
  echo
  cat "$OUT/$pass/results.md"
done | sq_table -
sq_log "results under $OUT"
