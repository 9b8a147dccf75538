#!/usr/bin/env bash
# bench/guest_path.sh — the block device paths side by side in the test guest (issue 35), one
# command: the release binary (or BIN), one boot of the test guest (scripts/guest/run.sh) running
# bench/guest/path.sh, which measures in that boot
#   plain   a loop device (direct I/O) on a file on the guest's virtio disk
#   ublk    /dev/ublkb0 (`squeeze serve --ublk`)
#   nbd     /dev/nbd0 (the kernel's nbd client, `nbd-client -unix SOCK -C 2`)
#   fuse    a loop device (direct I/O) on the FUSE export (`squeeze serve --fuse-dir`)
# (and, named in PATHS, fuse-buffered and ublk-buffered: the FUSE export or ublk with the backing
# file written through the page cache, as the ublk server wrote it until 2026-11-27)
# with every volume --mode none (the path's cost, not compression's), and fio (libaio, O_DIRECT,
# QD32): 128 KiB sequential write and read, 4 KiB random write and read.
#
#   sudo bench/guest_path.sh                        # SIZE=512M, RUNTIME=20, REPS=1
#   sudo BIN=target/release/squeeze REPS=2 bench/guest_path.sh
#
# Per path and job: MB/s, IOPS (fio's), and CPU seconds per GiB the device moved: the guest's
# whole machine (its /proc/stat busy time: fio, the kernel, the server) and the server (squeeze
# serve's utime+stime), counted from the job's first sector to fio's exit. On stdout and in OUT/table.md: that table, then ublk's CPU per GiB as a fraction
# of the FUSE path's (the issue's target: at most 0.5). OUT/results.jsonl: one line per path
# and job. OUT/guest/: fio's JSON, the server logs, the console.
#
# The guest runs under TCG (emulation) where /dev/kvm cannot run it, as on the project's
# machine: the absolute figures are then meaningless, only the ratios between paths indicate.
# Needs what scripts/guest/run.sh needs (root; scripts/guest/README.md), python3. Holds the
# bench lock for the whole run (bench/README.md); one run takes about 10 minutes.
#
# Env: PATHS ("plain ublk nbd fuse"), SIZE (512M), RUNTIME (20 s per timed job), REPS (1,
#      rounds in the one boot), JOBS (all four), PROFILE (1: OUT/profile.md, where the guest's
#      CPU went by /proc/stat field and by task: bench/guest_profile.py), OUT (results/guest_path-<time>), BIN,
#      BENCH_LOCK (/tmp/bench.lock), SQUEEZE_GUEST_TIMEOUT (1800), and those of run.sh
#      (SQUEEZE_GUEST_CACHE, SQUEEZE_GUEST_CPUS, SQUEEZE_GUEST_MEM, SQUEEZE_GUEST_ACCEL).
set -euo pipefail

SQ_PROG=bench/guest_path.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $(id -u) == 0 ]] || sq_die "run as root (the test guest needs it: scripts/guest/README.md)"
command -v python3 >/dev/null || sq_die "missing python3"
export SQUEEZE_TEST_PATHS=${PATHS:-plain ublk nbd fuse}
export SQUEEZE_TEST_SIZE=${SIZE:-512M}
export SQUEEZE_TEST_RUNTIME=${RUNTIME:-20}
export SQUEEZE_TEST_REPS=${REPS:-1}
export SQUEEZE_TEST_JOBS=${JOBS:-seqwrite-128k seqread-128k randwrite-4k randread-4k}
export SQUEEZE_TEST_PROFILE=${PROFILE:-0}
export SQUEEZE_GUEST_TIMEOUT=${SQUEEZE_GUEST_TIMEOUT:-1800}
# This harness holds the bench lock: run.sh must not wait for it again.
unset SQUEEZE_GUEST_LOCK
sq_lock
sq_bin
sq_out guest_path
{
  echo "guest: qemu ${SQUEEZE_GUEST_ACCEL:-tcg}, ${SQUEEZE_GUEST_CPUS:-2} vCPUs, ${SQUEEZE_GUEST_MEM:-2G}"
  echo "settings: paths=$SQUEEZE_TEST_PATHS size=$SQUEEZE_TEST_SIZE runtime=$SQUEEZE_TEST_RUNTIME reps=$SQUEEZE_TEST_REPS"
} >>"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

rc=0
SQUEEZE_GUEST_QUIET=${SQUEEZE_GUEST_QUIET:-1} "$SQ_ROOT/scripts/guest/run.sh" "$BIN" \
  "$SQ_ROOT/bench/guest/path.sh" "$OUT/guest" || rc=$?
grep -E '^\[|^FAIL' "$OUT/guest/test.log" 2>/dev/null | sed 's/^/  guest: /' >&2 || true
cat "$OUT/guest/guest.txt" >>"$OUT/machine.txt" 2>/dev/null || true
[[ -s $OUT/guest/results.tsv ]] || sq_die "the guest measured nothing (exit $rc): see $OUT/guest/console.log"

python3 - "$OUT/guest" <<'EOF' | sq_emit | sq_table -
import json, os, sys
from collections import defaultdict
d = sys.argv[1]
rows = []
for line in open(os.path.join(d, "results.tsv")):
    rep, path, job, busy, server, hz, moved = line.split()
    t = open(os.path.join(d, f"{rep}-{path}-{job}.json")).read()
    j, _ = json.JSONDecoder().raw_decode(t[t.index("{"):])
    fj = j["jobs"][0]
    side = fj["read"] if fj["read"]["io_bytes"] > fj["write"]["io_bytes"] else fj["write"]
    # CPU per GiB the device moved while it was counted (bench/guest/path.sh)
    gib = int(moved) / 2**30
    hz = int(hz)
    if int(moved) < 0.8 * side["io_bytes"]:
        print(f"warning: rep {rep} {path} {job}: the CPU window saw {int(moved) >> 20} MiB of fio's "
              f"{side['io_bytes'] >> 20} MiB (the job's start was noticed late)", file=sys.stderr)
    if int(moved) == 0:
        continue
    r = {"rep": int(rep), "path": path, "job": job, "MB/s": round(side["bw_bytes"] / 1e6, 1),
         "IOPS": round(side["iops"]), "gib": round(gib, 3), "fio_gib": round(side["io_bytes"] / 2**30, 3),
         "guest_cpu_s_per_gib": round(int(busy) / hz / gib, 2),
         "server_cpu_s_per_gib": round(int(server) / hz / gib, 2)}
    rows.append(r)
    print(json.dumps(r))
# The table: the median over reps of each figure (one rep: the figure itself).
def med(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
by = defaultdict(list)
for r in rows:
    by[(r["job"], r["path"])].append(r)
jobs = list(dict.fromkeys(r["job"] for r in rows))
paths = list(dict.fromkeys(r["path"] for r in rows))
print("| job | path | MB/s | IOPS | guest CPU s/GiB | server CPU s/GiB |")
print("|---|---|---:|---:|---:|---:|")
for job in jobs:
    for path in paths:
        rs = by.get((job, path))
        if not rs:
            continue
        print(f"| {job} | {path} | {med([r['MB/s'] for r in rs]):.1f} | {med([r['IOPS'] for r in rs]):.0f} | "
              f"{med([r['guest_cpu_s_per_gib'] for r in rs]):.1f} | {med([r['server_cpu_s_per_gib'] for r in rs]):.1f} |")
for ref in ("fuse", "fuse-buffered"):
    if "ublk" not in paths or ref not in paths:
        continue
    print()
    print(f"| job | ublk/{ref} guest CPU per GiB | ublk/{ref} server CPU per GiB | ublk/{ref} MB/s | target (guest CPU <= 0.5) |")
    print("|---|---:|---:|---:|---|")
    for job in jobs:
        u, f = by.get((job, "ublk")), by.get((job, ref))
        if not u or not f:
            continue
        g = med([r["guest_cpu_s_per_gib"] for r in u]) / med([r["guest_cpu_s_per_gib"] for r in f])
        s = med([r["server_cpu_s_per_gib"] for r in u]) / max(med([r["server_cpu_s_per_gib"] for r in f]), 1e-9)
        b = med([r["MB/s"] for r in u]) / med([r["MB/s"] for r in f])
        print(f"| {job} | {g:.2f} | {s:.2f} | {b:.2f} | {'met' if g <= 0.5 else 'not met'} |")
EOF
if [[ ${PROFILE:-0} == 1 ]]; then
  python3 "$SQ_ROOT/bench/guest_profile.py" "$OUT/guest" >"$OUT/profile.md" || rc=1
  sq_log "where the CPU went: $OUT/profile.md"
fi
sq_log "results in $OUT (table.md, results.jsonl; guest/: fio JSON, server logs, console)"
exit "$rc"
