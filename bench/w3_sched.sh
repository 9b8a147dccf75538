#!/usr/bin/env bash
# bench/w3_sched.sh — one W3 copy (nbdcopy of the tar of real files) onto one fresh peer under
# `perf sched record`, then `perf sched timehist -s`: per thread of the whole machine, how long it
# ran and how often it was woken, and how long each core sat idle (issue 37 item 2: where a
# server waits rather than works).
#
#   flock /tmp/bench.lock bench/w3_sched.sh raw|none|default OUTDIR [serve options...]
#
# raw: qemu-nbd --cache=none --aio=native on a raw file (bench/w3ab-floor.sh's peer); none:
# `squeeze serve --mode none`; default: `squeeze serve` with its defaults. Output: OUTDIR/copy.txt
# (the copy's seconds), OUTDIR/sched.data, OUTDIR/timehist.txt (the summary). Needs root (perf).
# Env: BIN (squeeze binary; default target/release/squeeze), TAR (~/.cache/squeeze-bench/usr.tar).
set -euo pipefail
PEER=$1
OUT=$2
shift 2
BIN=${BIN:-target/release/squeeze}
TAR=${TAR:-$HOME/.cache/squeeze-bench/usr.tar}
OPTS=(--flush -S 0 -C 1 -T 1 --request-size=1048576 -R 16)
mkdir -p "$OUT"
d=$(mktemp -d /var/tmp/w3sched.XXXX)
case $PEER in
  raw) truncate -s 3G "$d/img.raw"
       qemu-nbd -t -k "$d/nbd.sock" --cache=none --aio=native -f raw "$d/img.raw" >"$d/log" 2>&1 & ;;
  none) "$BIN" serve --socket "$d/nbd.sock" --control "$d/ctl" --size 64G --mode none "$@" "$d/vol.sqz" >"$d/log" 2>&1 & ;;
  default) "$BIN" serve --socket "$d/nbd.sock" --control "$d/ctl" --size 64G "$@" "$d/vol.sqz" >"$d/log" 2>&1 & ;;
  *) echo "peer: raw, none or default" >&2; exit 2 ;;
esac
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$d"' EXIT
for ((i = 0; i < 200; i++)); do
  nbdinfo --size "nbd+unix:///?socket=$d/nbd.sock" >/dev/null 2>&1 && break
  sleep 0.1
done
cat "$TAR" >/dev/null
t0=$(date +%s.%N)
perf sched record -o "$OUT/sched.data" -- nbdcopy "${OPTS[@]}" "$TAR" "nbd+unix:///?socket=$d/nbd.sock" 2>"$OUT/perf.err"
t1=$(date +%s.%N)
echo "peer $PEER copy $(python3 -c "print(round($t1 - $t0, 3))") s (with perf's own cost); server pid $pid" | tee "$OUT/copy.txt"
perf sched timehist -i "$OUT/sched.data" -s >"$OUT/timehist.txt" 2>/dev/null || true
grep -A3 "^Idle stats" "$OUT/timehist.txt" || true
