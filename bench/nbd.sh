#!/usr/bin/env bash
# bench/nbd.sh — `squeeze serve` against qemu-nbd, end to end over NBD, with the shared peer
# harness (../shared/bench/run.sh: read its header and README for the workloads and columns).
#
#   sudo bench/nbd.sh                      # build release, run both passes, print both tables
#   FIO_SIZE=1g REPS=2 sudo bench/nbd.sh   # smaller / repeated (every run.sh setting passes through)
#
# Pass 1 ("compress"): PEERS="nbd-raw nbd-qcow2-compress custom", the custom peer being
#   `squeeze serve` with its default policy (lz4, aggressive), so the raw qemu-nbd baseline, the
#   compressing qcow2 and squeeze are measured in the same run (issue 3's targets compare rows of
#   one run only).
# Pass 2 ("none"): PEERS="nbd-raw custom" with squeeze created by serve with `--mode none`
#   (no codec, zero detection only), against a fresh qemu-nbd raw baseline in the same run.
# Optional pass "zstd" (PASSES="compress none zstd"): PEERS="nbd-qcow2-compress custom" with
#   squeeze on `--algorithm zstd:1`, the codec the qcow2 peer uses, to compare ratios like for like.
#
# Workloads (fio 3.33 ioengine=nbd, data 60% compressible per 4 KiB chunk, refilled per I/O):
#   W1 128k sequential write of FIO_SIZE at QD128, 128k sequential read QD128, 4k random read
#   QD32 for 20 s; W2 4k random write QD32 for 20 s over W1's data; W3 nbdcopy of a ~1 GiB tar of
#   /usr (real files) onto a fresh volume.
# Physical bytes of squeeze: `du` of its data dir (the sparse volume file), as for every peer.
#
# Env: SQUEEZE_SERVE_ARGS (extra `serve` options for both passes, e.g. "--workers 8"),
#      HARNESS (../shared/bench/run.sh), CARGO_TARGET_DIR (target), OUT_BASE
#      (/tmp/squeeze-nbd-bench.<time>), PASSES ("compress none"); plus run.sh's own
#      (REPS, FIO_SIZE, FIO_RT_SEQ, FIO_RT_RAND, ...). Needs root (run.sh requires it).
# Output: each pass's CSV and markdown table under $OUT_BASE/<pass>/, both tables on stdout.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HARNESS=${HARNESS:-$ROOT/../shared/bench/run.sh}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
OUT_BASE=${OUT_BASE:-/tmp/squeeze-nbd-bench.$(date +%Y%m%d-%H%M%S)}
PASSES=${PASSES:-compress none}

[[ -x $HARNESS ]] || { echo "bench/nbd.sh: no harness at $HARNESS" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "bench/nbd.sh: run.sh needs root" >&2; exit 1; }

echo "bench/nbd.sh: building the release binary in $TARGET" >&2
(cd "$ROOT" && CARGO_TARGET_DIR=$TARGET cargo build --release --quiet --bin squeeze)
BIN=$TARGET/release/squeeze
[[ -x $BIN ]] || { echo "bench/nbd.sh: no binary at $BIN" >&2; exit 1; }
export BIN

mkdir -p "$OUT_BASE"
{
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (dirty)')"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') x $(nproc)"
  echo "mem: $(free -g | awk '/^Mem:/{print $2}') GiB; kernel $(uname -r)"
  echo "squeeze: $("$BIN" --version); serve args: ${SQUEEZE_SERVE_ARGS:-(none)}"
} | tee "$OUT_BASE/machine.txt" >&2

for pass in $PASSES; do
  case $pass in
    compress)
      name=squeeze peers="nbd-raw nbd-qcow2-compress custom" mode_args="" ;;
    none)
      name=squeeze-mode-none peers="nbd-raw custom" mode_args="--mode none" ;;
    zstd)
      name=squeeze-zstd1 peers="nbd-qcow2-compress custom" mode_args="--algorithm zstd:1" ;;
    *) echo "bench/nbd.sh: unknown pass $pass (compress, none, zstd)" >&2; exit 1 ;;
  esac
  echo "bench/nbd.sh: pass $pass: PEERS=\"$peers\"" >&2
  # The server creates its volume (64 GiB thin) in the harness's fresh $PEER_DIR and stays in
  # the foreground (exec) so that the harness measures its CPU time.
  PEERS=$peers \
  PEER_CUSTOM_NAME=$name \
  PEER_CUSTOM_CMD="exec \"\$BIN\" serve --socket \"\$PEER_SOCK\" --size 64G $mode_args ${SQUEEZE_SERVE_ARGS:-} \"\$PEER_DIR/vol.sqz\"" \
  OUT=$OUT_BASE/$pass \
    "$HARNESS" >"$OUT_BASE/$pass.stdout"
done

for pass in $PASSES; do
  echo
  echo "## pass $pass"
  echo
  cat "$OUT_BASE/$pass/results.md"
done
echo "bench/nbd.sh: results under $OUT_BASE" >&2
