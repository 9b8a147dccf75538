#!/usr/bin/env bash
# bench/flush_cost.sh — what a change costs the flush path, A/B in one run
# (issue 34: the flush marks). Two builds of squeeze, BEFORE and AFTER,
# measured in turn (REPS rounds, alternating, so drift hits both):
#
#   1. pg_test_fsync through the FUSE export: `squeeze serve --fuse-dir
#      --prewrite` -> loop device -> ext4 -> pg_test_fsync (one 8 KiB
#      write + fdatasync, one process): what one PostgreSQL WAL commit costs;
#   2. `squeeze wal bench --sizes 128 --threads 1,8`: the engine's own
#      commits of 128 B (write + flush), no FUSE, dense and sparse layouts;
#   3. pg_test_fsync on the plain file system under the volumes: one
#      fdatasync of this disk, the yardstick ("small against one fdatasync");
#   4. bench/fdatasync_pages.py on the same file system: what a second page
#      (a mark) costs one fdatasync, written as squeeze writes it and the
#      other ways it could be: the floor under the marks' cost.
#
# Usage: sudo BEFORE=path/to/squeeze AFTER=path/to/squeeze bench/flush_cost.sh
# Env:   AFTER (default: BIN, else the release build of this checkout),
#        OUT (default results/flush_cost-DATE), REPS (default 3),
#        SECS (pg_test_fsync seconds per test, default 3), DIR (scratch,
#        default a temp dir under /var/tmp: the file system measured),
#        BENCH_LOCK (/tmp/bench.lock).
# Writes OUT/results.jsonl (one line per measurement) and OUT/table.md.
# The whole run holds the bench lock (bench/README.md).
set -euo pipefail
SQ_PROG=flush_cost
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"

[[ $(id -u) == 0 ]] || sq_die "needs root (loop devices, mount)"
: "${BEFORE:?BEFORE=path to the squeeze binary before the change}"
[[ -x $BEFORE ]] || sq_die "BEFORE=$BEFORE is not an executable"
REPS=${REPS:-3}
SECS=${SECS:-3}
PG_TEST_FSYNC=${PG_TEST_FSYNC:-$(printf "%s\n" /usr/lib/postgresql/*/bin/pg_test_fsync | tail -n1)}
[[ -x ${PG_TEST_FSYNC:-} ]] || sq_die "pg_test_fsync not found (apt-get install postgresql)"
for t in losetup mkfs.ext4 fusermount3 python3; do
  command -v "$t" >/dev/null || sq_die "$t not installed"
done
sq_lock
[[ -z ${AFTER:-} ]] || BIN=$AFTER
sq_bin
AFTER=$BIN
DIR=${DIR:-$(mktemp -d /var/tmp/flush_cost.XXXXXX)}
sq_out flush_cost "$DIR"

# usecs/op of the first fdatasync line of pg_test_fsync's output.
fdatasync_us() { awk '/fdatasync/ && /usecs\/op/ { for (i = 1; i <= NF; i++) if ($i == "usecs/op") { print $(i-1); exit } }'; }

result() { # result NAME BUILD METRIC VALUE
  sq_result bench=flush_cost case="$1" build="$2" metric="$3" value="$4"
  sq_log "$1 $2 $3 = $4"
}

LOOP=
cleanup() {
  mountpoint -q "$DIR/mnt" 2>/dev/null && umount "$DIR/mnt"
  [[ -n $LOOP ]] && losetup -d "$LOOP" 2>/dev/null
  LOOP=
  sq_serve_stop fuse
  rm -f "$DIR/vol.sqz"
}
cleanup_all() { cleanup; rm -rf "$DIR"; }
sq_on_exit cleanup_all

fuse_pg_test_fsync() { # BUILD BIN
  local build=$1 bin=$2 us
  mkdir -p "$DIR/fuse" "$DIR/mnt"
  BIN=$bin sq_serve_start fuse "$OUT/serve-$build.log" --ready "$DIR/fuse/vol" -- \
    --socket "$DIR/nbd.sock" --control "$DIR/ctl" --size 4G --fuse-dir "$DIR/fuse" --prewrite "$DIR/vol.sqz"
  LOOP=$(losetup -f --show "$DIR/fuse/vol")
  mkfs.ext4 -q -E nodiscard "$LOOP"
  mount "$LOOP" "$DIR/mnt"
  us=$("$PG_TEST_FSYNC" -s "$SECS" -f "$DIR/mnt/probe" | tee "$OUT/pg_test_fsync-fuse-$build.txt" | fdatasync_us)
  result fuse_pg_test_fsync "$build" fdatasync_usecs_per_op "$us"
  cleanup
}

wal_bench() { # BUILD BIN
  local build=$1 bin=$2
  "$bin" wal bench --dir "$DIR" --sizes 128 --threads 1,8 --json \
    >"$OUT/wal-$build.json"
  python3 - "$OUT/wal-$build.json" "$build" <<'EOF' | sq_result -
import json, sys
for r in json.load(open(sys.argv[1])):
    for k in ("commits_per_second", "latency_us_p50", "latency_us_p99"):
        print(json.dumps({"bench": "flush_cost",
                          "case": f"wal_{r['layout']}_{r['record_bytes']}B_{r['threads']}t",
                          "build": sys.argv[2], "metric": k, "value": r[k]}))
EOF
}

for rep in $(seq "$REPS"); do
  for build in before after; do
    bin=$BEFORE
    [[ $build == after ]] && bin=$AFTER
    sq_log "round $rep/$REPS: $build ($bin)"
    fuse_pg_test_fsync "$build" "$bin"
    wal_bench "$build" "$bin"
  done
  us=$("$PG_TEST_FSYNC" -s "$SECS" -f "$DIR/plain_probe" | fdatasync_us)
  result plain_pg_test_fsync host fdatasync_usecs_per_op "$us"
  rm -f "$DIR/plain_probe"
  python3 "$(dirname "$0")/fdatasync_pages.py" --dir "$DIR" --rounds 1 | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    print(json.dumps({"bench": "flush_cost", "case": "pages_" + r["case"], "build": "host",
                      "metric": "p50_us", "value": r["p50_us"]}))' | sq_result -
done

python3 - "$OUT/results.jsonl" <<'EOF' | sq_table -
import json, statistics, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for r in rows:
    by[(r["case"], r["metric"], r["build"])].append(r["value"])
cases = sorted({(c, m) for c, m, _ in by})
print("| case | metric | before (median) | after (median) | after / before | plain file fdatasync |")
print("|---|---|---:|---:|---:|---:|")
plain = by.get(("plain_pg_test_fsync", "fdatasync_usecs_per_op", "host"))
plain_s = f"{statistics.median(plain):.0f} us" if plain else "-"
for c, m in cases:
    h = by.get((c, m, "host"))
    if h and c.startswith("pages_"):
        print(f"| {c} (the disk alone) | {m} | {statistics.median(h):.1f} | | | {plain_s} |")
        continue
    b, a = by.get((c, m, "before")), by.get((c, m, "after"))
    if not b or not a:
        continue
    mb, ma = statistics.median(b), statistics.median(a)
    print(f"| {c} | {m} | {mb:.1f} | {ma:.1f} | {ma / mb:.3f} | {plain_s} |")
EOF
sq_log "results in $OUT"
