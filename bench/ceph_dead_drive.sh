#!/usr/bin/env bash
# bench/ceph_dead_drive.sh — a Ceph cluster whose OSDs sit on squeeze volumes survives a dead
# drive (issue 18): the squeeze server under one OSD is SIGKILLed while a client writes.
#
#   sudo bench/ceph_dead_drive.sh
#   sudo NOSD=4 POOL_SIZE=2 VICTIM=3 bench/ceph_dead_drive.sh
#
# NOSD OSDs (3), each on its own volume behind its own `squeeze serve --fuse-dir` (its own
# process: one server per drive, as a host with several drives would run them) and a loop
# device on the FUSE export (docs/CEPH.md); one mon, one mgr, on loopback (bench/ceph_lib.sh);
# a replicated pool of POOL_SIZE (3; min_size one less). Then, with fio's rbd engine and crc32c
# verify headers in every 128 KiB block (db_bench-like data, 60% compressible):
#   1. before: fio writes image `before` (IMAGE_SIZE).
#   2. during: fio writes image `during` (IMAGE_SIZE at RATE, so it spans the outage); after
#      KILL_AFTER seconds the squeeze server under osd.VICTIM gets SIGKILL. The script reports
#      when Ceph marked the OSD down and how long the client's writes stalled (fio's
#      per-second bandwidth log); fio must finish without an error.
#   3. The server restarts on the same volume (its own recovery), a new loop device replaces
#      the dead one, the OSD restarts; the time to every placement group active+clean again.
#   4. after: fio writes image `after`.
#   5. A deep scrub of every placement group; `rados list-inconsistent-pg` must be empty.
#   6. fio reads all three images back and checks every block (verify_only).
#   7. Each server's volume is closed and `squeeze check` must find it clean.
# Exit status 0 only when every step passed. Output: OUT/summary.txt (also on stdout; each line
# also in OUT/results.jsonl, with "failed", and OUT/table.md), fio's JSON and logs, Ceph's and the
# servers' logs under OUT. The cluster's files and the volumes are in a scratch directory under
# SCRATCH_BASE, removed at exit. The whole run holds the bench lock (bench/README.md).
#
# Env: NOSD (3), POOL_SIZE (3), VICTIM (1), IMAGE_SIZE (512m), RATE (8m: bytes/s of the
#      `during` writer), KILL_AFTER (15), DEV_SIZE (16G, thin), OUT
#      (results/ceph_dead_drive-<time>), SCRATCH_BASE (/var/tmp), BENCH_LOCK, BIN,
#      SQUEEZE_SERVE_ARGS.
# Needs root, Debian's Ceph and fio with rbd (installed by apt-get when missing; INSTALL=0
# refuses).
set -euo pipefail

SQ_PROG=bench/ceph_dead_drive.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[[ $(id -u) == 0 ]] || sq_die "run as root (loop devices, FUSE mounts, Ceph daemons)"
# shellcheck source=bench/ceph_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/ceph_lib.sh"

NOSD=${NOSD:-3}
POOL_SIZE=${POOL_SIZE:-3}
VICTIM=${VICTIM:-1}
IMAGE_SIZE=${IMAGE_SIZE:-512m}
RATE=${RATE:-8m}
KILL_AFTER=${KILL_AFTER:-15}
DEV_SIZE=${DEV_SIZE:-16G}
((VICTIM < NOSD)) || sq_die "VICTIM=$VICTIM is not one of the $NOSD OSDs"
((POOL_SIZE >= 2 && POOL_SIZE <= NOSD)) || sq_die "POOL_SIZE must be 2..=NOSD"

ceph_need
sq_lock
sq_bin
SCR=$(mktemp -d "${SCRATCH_BASE:-/var/tmp}/squeeze-ceph-dead.XXXXXX")
declare -A SERVER LOOP

server_start() { # server_start I: squeeze serve for OSD I's volume, a loop device on its export
  local i=$1
  mkdir -p "$SCR/dev"
  # shellcheck disable=SC2086
  sq_serve_start "osd$i" "$OUT/squeeze$i.log" --ready "$SCR/fuse$i/osd$i" -- \
    --socket "$SCR/nbd$i.sock" --control "$SCR/ctl$i.sock" --size "$DEV_SIZE" \
    --fuse-dir "$SCR/fuse$i" ${SQUEEZE_SERVE_ARGS:-} "$SCR/osd$i.sqz"
  SERVER[$i]=$(sq_serve_pid "osd$i")
  LOOP[$i]=$(losetup -f --show --direct-io=on "$SCR/fuse$i/osd$i")
  echo 0 >"/sys/block/${LOOP[$i]#/dev/}/queue/rotational" 2>/dev/null || true
  ln -sfn "${LOOP[$i]}" "$SCR/dev/osd.$i"
}

server_stop() { # server_stop I: SIGTERM (the volume closes cleanly), the loop device goes
  local i=$1
  [[ -n ${LOOP[$i]:-} ]] && { losetup -d "${LOOP[$i]}" 2>/dev/null || true; }
  LOOP[$i]=""
  sq_serve_stop "osd$i"
  SERVER[$i]=""
}

cleanup() {
  local i
  ceph_stop
  for ((i = 0; i < NOSD; i++)); do
    server_stop "$i"
    mountpoint -q "$SCR/fuse$i" 2>/dev/null && { umount -l "$SCR/fuse$i" 2>/dev/null || true; }
  done
  rm -rf "$SCR"
}
sq_on_exit cleanup
sq_out ceph_dead_drive "$SCR"
echo "ceph: $(ceph --version 2>/dev/null | head -n1)" >>"$OUT/machine.txt"
CDIR=$OUT

fio_rbd() { # fio_rbd NAME IMAGE [extra...]: 128 KiB sequential blocks with verify headers
  local name=$1 image=$2
  shift 2
  fio --name="$name" --ioengine=rbd --clientname=admin --pool=rbd --rbdname="$image" \
    --rw=write --bs=128k --iodepth=16 --size="$IMAGE_SIZE" --buffer_compress_percentage=60 \
    --buffer_compress_chunk=4k --refill_buffers --randrepeat=1 --verify=crc32c \
    --verify_fatal=1 --output-format=json "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"
}

: >"$OUT/summary.txt"
sq_log "a cluster of $NOSD OSDs on squeeze volumes, pool size $POOL_SIZE"
ceph_conf "$NOSD" "$POOL_SIZE"
ceph_mon_mgr_up
for ((i = 0; i < NOSD; i++)); do
  server_start "$i"
  ceph_osd_add "$i"
done
ceph osd set noout >/dev/null 2>&1 # a dead drive comes back: no rebalancing away from it
ceph_pool rbd 32 none
ceph_wait_clean 300
for img in before during after; do
  rbd create --size "$(python3 -c "
s='$IMAGE_SIZE'.lower(); m={'k':2**10,'m':2**20,'g':2**30}
print(max(1, (int(s[:-1])*m[s[-1]] if s[-1] in m else int(s)) >> 20))")M" "rbd/$img" \
    || sq_die "rbd create $img failed"
done

sq_log "1. before: writing $IMAGE_SIZE"
fio_rbd before before --do_verify=0 || fail "fio before: $(tail -n3 "$OUT/before.err")"

sq_log "2. during: writing $IMAGE_SIZE at $RATE/s; SIGKILL of osd.$VICTIM's server after ${KILL_AFTER}s"
t_start=$(now)
fio_rbd during during --do_verify=0 --rate="$RATE" --write_bw_log="$OUT/during" \
  --log_avg_msec=1000 &
fio_pid=$!
sleep "$KILL_AFTER"
kill -9 "${SERVER[$VICTIM]}"
t_kill=$(now)
say "killed the squeeze server under osd.$VICTIM (pid ${SERVER[$VICTIM]}) at $(since "$t_start") s"
sq_serve_stop "osd$VICTIM" KILL # (reaps it)
SERVER[$VICTIM]=""
if ceph_wait 120 "osd.$VICTIM down" ceph_osd_is "$VICTIM" down; then
  say "osd.$VICTIM marked down $(since "$t_kill") s after the kill"
fi
# The OSD has lost its device: whether it aborted on the I/O error or not, it goes.
opid=$(ceph_osd_pid "$VICTIM" || true)
if [[ -n $opid ]] && kill -0 "$opid" 2>/dev/null; then
  say "ceph-osd $VICTIM was still running after it was marked down: stopped"
  kill "$opid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$opid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$opid" 2>/dev/null || true
else
  say "ceph-osd $VICTIM exited on its own (its log: $(grep -a -m1 -o \
    '_aio_thread got r=-[0-9]* (([0-9]*) [^)]*\|Unexpected IO error[^.]*' "$SCR/log/osd.$VICTIM.log" \
    2>/dev/null | head -n1 || echo '?'))"
fi
cp "$SCR/log/osd.$VICTIM.log" "$OUT/osd.$VICTIM-before-restart.log" 2>/dev/null || true
rm -f "$SCR/run/osd.$VICTIM.pid"

sq_log "3. restart: the server on the same volume, a new loop device, the OSD"
losetup -d "${LOOP[$VICTIM]}" 2>/dev/null || true
t_restart=$(now)
server_start "$VICTIM"
say "the squeeze server under osd.$VICTIM served again $(since "$t_restart") s after its restart"
ceph_osd_start "$VICTIM"
ceph_wait_osd "$VICTIM" up 180
say "osd.$VICTIM up $(since "$t_restart") s after the restart began"
if wait "$fio_pid"; then
  say "fio during: finished without an error ($(since "$t_start") s)"
else
  fail "fio during failed: $(tail -n3 "$OUT/during.err")"
fi
ceph_wait_clean 600
say "every placement group active+clean $(since "$t_restart") s after the restart began"
stall=$(python3 - "$OUT"/during_bw*.log "$KILL_AFTER" <<'EOF'

import sys
*logs, kill = sys.argv[1:]
kill = float(kill)
per = {}
for f in logs:
    for line in open(f):
        p = [x.strip() for x in line.split(",")]
        if len(p) >= 2:
            t = int(p[0]) // 1000
            per[t] = per.get(t, 0) + int(p[1])
secs = sorted(per)
stall, run = 0, 0
for t in range(int(kill), (secs[-1] + 1) if secs else 0):
    run = run + 1 if per.get(t, 0) == 0 else 0
    stall = max(stall, run)
print(f"the client's writes: {len(secs)} seconds logged, the longest stall after the kill "
      f"{stall} s (seconds with no write completed)")
EOF
)
say "$stall"

sq_log "4. after: writing $IMAGE_SIZE"
fio_rbd after after --do_verify=0 || fail "fio after: $(tail -n3 "$OUT/after.err")"

sq_log "5. deep scrub"
t_scrub=$(date +%s)
ceph osd pool deep-scrub rbd >/dev/null 2>&1 || {
  for pg in $(ceph pg ls-by-pool rbd --format json 2>/dev/null \
      | python3 -c 'import json,sys; d=json.load(sys.stdin); [print(p["pgid"]) for p in d.get("pg_stats", d)]'); do
    ceph pg deep-scrub "$pg" >/dev/null 2>&1
  done
}
scrubbed() {
  ceph pg ls-by-pool rbd --format json 2>/dev/null | python3 -c "
import json, sys, datetime
d = json.load(sys.stdin)
pgs = d.get('pg_stats', d)
def ts(s): return datetime.datetime.strptime(s.split('.')[0], '%Y-%m-%dT%H:%M:%S').replace(tzinfo=datetime.timezone.utc).timestamp()
sys.exit(0 if pgs and all(ts(p['last_deep_scrub_stamp']) >= $t_scrub - 1 for p in pgs) else 1)"
}
if ceph_wait 900 "the deep scrub of every placement group" scrubbed; then
  incons=$(rados list-inconsistent-pg rbd 2>/dev/null || echo '?')
  if [[ $incons == "[]" ]]; then
    say "deep scrub of every placement group: no inconsistency ($(($(date +%s) - t_scrub)) s)"
  else
    fail "deep scrub found inconsistent placement groups: $incons"
  fi
fi
ceph health detail >"$OUT/health.txt" 2>&1 || true

sq_log "6. reading every image back"
for img in before during after; do
  if fio_rbd "verify-$img" "$img" --verify_only=1; then
    say "image $img: every block read back as written"
  else
    fail "image $img does not read back: $(tail -n3 "$OUT/verify-$img.err")"
  fi
done

sq_log "7. the volumes: closed cleanly, checked"
ceph_stop
for ((i = 0; i < NOSD; i++)); do
  server_stop "$i"
  if "$BIN" check "$SCR/osd$i.sqz" >"$OUT/check$i.txt" 2>&1; then
    say "squeeze check osd$i.sqz: clean ($(grep -m1 -i 'ratio\|mapped' "$OUT/check$i.txt" || true))"
  else
    fail "squeeze check osd$i.sqz: $(tail -n3 "$OUT/check$i.txt")"
  fi
done
cp "$SCR"/log/*.log "$OUT/" 2>/dev/null || true
if ((FAILED)); then
  sq_table
  sq_die "some steps failed (see $OUT/summary.txt)"
fi
say "PASSED: a dead drive under osd.$VICTIM cost no data (results in $OUT)"
sq_table
