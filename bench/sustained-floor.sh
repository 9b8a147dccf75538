#!/usr/bin/env bash
# bench/sustained-floor.sh — a sustained writer with no idle (issue 37 item 2): nbdcopy of the W3
# tar over and over onto the same offsets of one `squeeze serve` volume for SECONDS_TOTAL seconds,
# while the server's stats are read every second: the codec of the last write batch and why, the
# busy share, bytes stored raw by the burst floor (total and pending), the live ratio, du, and
# the bytes written. Prints one line per second (t, codec, why, cpu, MB/s over the last second,
# raw_stored, raw_pending, room open, live ratio, du ratio) and a summary: codec changes and the
# time spent at each codec, MB/s and ratio per minute.
#
#   flock /tmp/bench.lock bench/sustained-floor.sh BIN [serve options...]
#
# Env: SECONDS_TOTAL (600), TAR (/var/tmp/fc/w3.tar), SCR (/var/tmp/fc).
set -euo pipefail
BIN=$1
shift
TOTAL=${SECONDS_TOTAL:-600}
TAR=${TAR:-/var/tmp/fc/w3.tar}
SCR=${SCR:-/var/tmp/fc}
OPTS=(--flush -S 0 -C 1 -T 1 --request-size=1048576 -R 16)
d=$(mktemp -d "$SCR/sustained.XXXX")
"$BIN" serve --socket "$d/nbd.sock" --control "$d/ctl" --size 64G "$@" "$d/vol.sqz" >"$d/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$d"' EXIT
for ((i = 0; i < 200; i++)); do
  nbdinfo --size "nbd+unix:///?socket=$d/nbd.sock" >/dev/null 2>&1 && break
  sleep 0.1
done
echo "# $(date -u +%FT%TZ) sustained writer ${TOTAL}s: $BIN serve $*; tar $(stat -c %s "$TAR") bytes"
cat "$TAR" >/dev/null
(
  end=$(($(date +%s) + TOTAL))
  while (($(date +%s) < end)); do
    nbdcopy "${OPTS[@]}" "$TAR" "nbd+unix:///?socket=$d/nbd.sock"
  done
) &
writer=$!
python3 - "$BIN" "$d" "$TOTAL" "$(stat -c %s "$TAR")" "$writer" <<'EOF'
import json, os, subprocess, sys, time
bin_, d, total, tar_b, writer = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
def stats():
    out = subprocess.run([bin_, "stats", "--json", d + "/ctl"], capture_output=True, text=True).stdout
    return next(iter(json.loads(out).values()))
def du():
    return int(subprocess.run(["du", "-sB1", d], capture_output=True, text=True).stdout.split()[0])
t0 = time.time(); prev = None; rows = []
print("t codec why cpu MB/s raw_stored_MiB raw_pending_MiB room_open live_ratio du_ratio_of_mapped")
while True:
    try:
        alive = open(f"/proc/{writer}/stat").read().split()[2] != "Z"
    except OSError:
        alive = False
    time.sleep(1)
    try:
        s = stats()
    except Exception as e:
        print("no stats", e); continue
    t = time.time() - t0
    w = s["bytes_written"]
    rate = 0 if prev is None else (w - prev[1]) / (t - prev[0]) / 1e6
    prev = (t, w)
    mapped = max(s.get("mapped_bytes", 1), 1)
    dub = du()
    row = dict(t=t, codec=s["write_algorithm"], why=s.get("write_algorithm_why"), cpu=s.get("cpu_busy") or 0,
               rate=rate, raw=s.get("burst_raw_bytes", 0), pend=s.get("burst_raw_pending_bytes", 0),
               room=s.get("burst_raw_room_open"), live=s.get("compression_ratio", 0), du=mapped / dub, written=w)
    rows.append(row)
    print("%5.0f %-6s %-7s %.2f %6.0f %7d %7d %-5s %.3f %.3f" % (t, row["codec"], row["why"], row["cpu"], rate,
          row["raw"] >> 20, row["pend"] >> 20, row["room"], row["live"], row["du"]), flush=True)
    if not alive or t > total + 30:
        break
changes = sum(1 for a, b in zip(rows, rows[1:]) if a["codec"] != b["codec"])
per = {}
for r in rows:
    per[r["codec"]] = per.get(r["codec"], 0) + 1
print(f"# summary: {len(rows)} one-second samples; codec changes between samples {changes}; seconds per codec {per}")
for m in range(0, int(rows[-1]["t"]) // 60 + 1):
    sel = [r for r in rows if m * 60 <= r["t"] < (m + 1) * 60]
    if len(sel) < 2:
        continue
    mb = (sel[-1]["written"] - sel[0]["written"]) / (sel[-1]["t"] - sel[0]["t"]) / 1e6
    codecs = {}
    for r in sel:
        codecs[r["codec"]] = codecs.get(r["codec"], 0) + 1
    print(f"# minute {m}: {mb:.0f} MB/s, live ratio {sel[-1]['live']:.3f}, du ratio (of mapped) {sel[-1]['du']:.3f}, raw stored {sel[-1]['raw']>>20} MiB (pending {sel[-1]['pend']>>20}), codecs {codecs}")
print(f"# total written {rows[-1]['written']/1e9:.1f} GB in {rows[-1]['t']:.0f} s")
EOF
wait $writer 2>/dev/null || true
