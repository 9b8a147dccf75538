#!/usr/bin/env bash
# bench/ceph_thin.sh — thin provisioning under Ceph (issue 18): an OSD whose device is a squeeze
# volume with a physical cap far below the logical size BlueStore sees, filled with data that
# does not compress, so squeeze's backing fills first.
#
#   sudo bench/ceph_thin.sh
#   sudo CAP=2G KEPT_SIZE=512m bench/ceph_thin.sh
#
# One mon, one mgr, one BlueStore OSD (bench/ceph_lib.sh) on a loop device on `squeeze serve
# --fuse-dir --metrics` of a volume made by `squeeze create --size DEV_SIZE --max-physical CAP`;
# a pool of size 1, BlueStore compression off. Then:
#   1. kept: fio (rbd engine, 128 KiB blocks with crc32c verify headers, incompressible data)
#      writes KEPT_SIZE and finishes: every byte of it acknowledged.
#   2. fill: fio writes incompressible data until the cap stops it. Meanwhile /metrics is
#      polled: when squeeze_space_low turned 1 (the warning before the end) and when the server
#      logged it. The OSD must stop on the write error (BlueStore aborts on an I/O error rather
#      than go on); the script waits for its process to exit, then kills the blocked client (its
#      writes would go on once the OSD is back).
#   3. The cap is raised live (`squeeze set CONTROL_SOCKET --max-physical CAP2`); squeeze's
#      /metrics must say the space is no longer low.
#   4. `ceph-bluestore-tool fsck --deep` of the stopped OSD must be clean.
#   5. The OSD restarts; every placement group active+clean; fio reads `kept` back and checks
#      every block (verify_only).
#   6. Everything stops; `squeeze check` of the volume must be clean.
# Exit status 0 only when every step passed. Output: OUT/summary.txt (also on stdout; each line
# also in OUT/results.jsonl, with "failed", and OUT/table.md), fio's JSON, Ceph's and the
# server's logs under OUT. The cluster's files and the volume are in a scratch directory under
# SCRATCH_BASE, removed at exit. The whole run holds the bench lock (bench/README.md).
#
# Env: CAP (3G), CAP2 (8G), DEV_SIZE (16G), KEPT_SIZE (1g), FILL_TIMEOUT (300 s),
#      METRICS (127.0.0.1:19109), OUT (results/ceph_thin-<time>), SCRATCH_BASE (/var/tmp),
#      BENCH_LOCK, BIN.
# Needs root, Debian's Ceph and fio with rbd (installed by apt-get when missing; INSTALL=0
# refuses).
set -euo pipefail

SQ_PROG=bench/ceph_thin.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[[ $(id -u) == 0 ]] || sq_die "run as root (loop devices, FUSE mounts, Ceph daemons)"
# shellcheck source=bench/ceph_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/ceph_lib.sh"

CAP=${CAP:-3G}
CAP2=${CAP2:-8G}
DEV_SIZE=${DEV_SIZE:-16G}
KEPT_SIZE=${KEPT_SIZE:-1g}
FILL_TIMEOUT=${FILL_TIMEOUT:-300}
METRICS=${METRICS:-127.0.0.1:19109}

command -v curl >/dev/null || sq_die "curl is missing (apt-get install curl)"
ceph_need
sq_lock
sq_bin
SCR=$(mktemp -d "${SCRATCH_BASE:-/var/tmp}/squeeze-ceph-thin.XXXXXX")
LOOP=""
FIO=""

stop_fill() { # the fill's fio (a child of the background subshell) and the subshell
  [[ -n $FIO ]] || return 0
  pkill -9 -P "$FIO" 2>/dev/null || true
  kill -9 "$FIO" 2>/dev/null || true
  wait "$FIO" 2>/dev/null || true
  FIO=""
}

cleanup() {
  stop_fill
  ceph_stop
  [[ -z $LOOP ]] || losetup -d "$LOOP" 2>/dev/null || true
  sq_serve_stop osd0
  mountpoint -q "$SCR/fuse" 2>/dev/null && { umount -l "$SCR/fuse" 2>/dev/null || true; }
  rm -rf "$SCR"
}
sq_on_exit cleanup
sq_out ceph_thin "$SCR"
echo "ceph: $(ceph --version 2>/dev/null | head -n1)" >>"$OUT/machine.txt"
CDIR=$OUT

metric() { # metric NAME: its value on /metrics (nothing when the server does not answer)
  curl -s --max-time 2 "http://$METRICS/metrics" 2>/dev/null | awk -v n="$1" 'index($1, n "{") == 1 || $1 == n { print $2; exit }'
}
physical() { squeeze_stat "$SCR/ctl.sock" physical_bytes 2>/dev/null || echo '?'; }

fio_rbd() { # fio_rbd NAME IMAGE SIZE [extra...]: incompressible 128 KiB blocks, verify headers
  local name=$1 image=$2 size=$3
  shift 3
  fio --name="$name" --ioengine=rbd --clientname=admin --pool=rbd --rbdname="$image" \
    --rw=write --bs=128k --iodepth=16 --size="$size" --buffer_compress_percentage=0 \
    --refill_buffers --randrepeat=1 --verify=crc32c --verify_fatal=1 --output-format=json \
    "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"
}

: >"$OUT/summary.txt"
sq_log "a volume of $DEV_SIZE capped at $CAP, one OSD on it"
ceph_conf 1 1
mkdir -p "$SCR"
"$BIN" create --size "$DEV_SIZE" --max-physical "$CAP" "$SCR/osd0.sqz" >"$OUT/create.log" 2>&1 \
  || sq_die "squeeze create failed: $(tail -n3 "$OUT/create.log")"
sq_serve_start osd0 "$OUT/squeeze.log" --ready "$SCR/fuse/osd0" -- \
  --socket "$SCR/nbd.sock" --control "$SCR/ctl.sock" --metrics "$METRICS" --fuse-dir "$SCR/fuse" "$SCR/osd0.sqz"
LOOP=$(losetup -f --show --direct-io=on "$SCR/fuse/osd0")
echo 0 >"/sys/block/${LOOP#/dev/}/queue/rotational" 2>/dev/null || true
ln -sfn "$LOOP" "$SCR/dev/osd.0"
ceph_mon_mgr_up
ceph_osd_add 0
ceph_pool rbd 32 none
ceph_wait_clean 120
rbd create --size "$(($(numfmt --from=iec "${DEV_SIZE^^}") >> 20))M" rbd/fill
rbd create --size "$(($(numfmt --from=iec "${KEPT_SIZE^^}") >> 20))M" rbd/kept

sq_log "1. kept: writing $KEPT_SIZE of incompressible data"
if fio_rbd kept kept "$KEPT_SIZE" --do_verify=0; then
  say "kept: $KEPT_SIZE written and acknowledged; squeeze physical bytes $(physical)"
else
  sq_die "fio kept failed before the cap was near: $(tail -n3 "$OUT/kept.err")"
fi

sq_log "2. fill: writing incompressible data until the cap ($CAP) stops it"
opid=$(ceph_osd_pid 0)
t_fill=$(now)
fio_rbd fill fill "$DEV_SIZE" --do_verify=0 &
FIO=$!
t_low=""
for ((i = 0; i < FILL_TIMEOUT * 10; i++)); do
  if [[ -z $t_low && $(metric squeeze_space_low) == 1 ]]; then
    t_low=$(since "$t_fill")
    say "/metrics: squeeze_space_low = 1 at $t_low s (free physical $(metric squeeze_free_physical_bytes) bytes)"
  fi
  kill -0 "$opid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$opid" 2>/dev/null; then
  fail "ceph-osd 0 still runs ${FILL_TIMEOUT}s after the fill began (physical $(physical))"
else
  say "ceph-osd 0 stopped $(since "$t_fill") s after the fill began; its last words: $(grep -a -m1 -o \
    '_aio_thread got r=-[0-9]* (([0-9]*) [^)]*\|Unexpected IO error[^.]*\|ENOSPC[^,]*' "$SCR/log/osd.0.log" | head -n1)"
fi
[[ -n $t_low ]] || fail "squeeze_space_low never turned 1 on /metrics before the OSD stopped"
if grep -q "free physical\|physical space" "$OUT/squeeze.log"; then
  say "the server's log warned: $(grep -m1 "free physical\|physical space" "$OUT/squeeze.log" | cut -c1-200)"
else
  fail "the server's log has no low-space warning"
fi
stop_fill
say "fill: $(python3 -c "
import json, sys
t = open('$OUT/fill.json').read()
try:
    j, _ = json.JSONDecoder().raw_decode(t[t.index('{'):])
    print(round(j['jobs'][0]['write']['io_bytes'] / 2**30, 2), 'GiB acknowledged to fio')
except Exception:
    print('fio was stopped before it reported')" 2>/dev/null); squeeze physical bytes $(physical)"
rm -f "$SCR/run/osd.0.pid"

sq_log "3. raising the cap to $CAP2, live"
"$BIN" set "$SCR/ctl.sock" --max-physical "$CAP2" >"$OUT/set.log" 2>&1 \
  || fail "squeeze set --max-physical $CAP2 failed: $(tail -n3 "$OUT/set.log")"
for ((i = 0; i < 300; i++)); do [[ $(metric squeeze_space_low) == 0 ]] && break; sleep 0.1; done
if [[ $(metric squeeze_space_low) == 0 ]]; then
  say "cap raised to $CAP2 on the running server; /metrics squeeze_space_low = 0, free physical $(metric squeeze_free_physical_bytes) bytes"
else
  fail "/metrics squeeze_space_low is still $(metric squeeze_space_low) after the cap was raised"
fi

sq_log "4. ceph-bluestore-tool fsck --deep"
if ceph-bluestore-tool fsck --deep true --path "$SCR/osd/0" >"$OUT/fsck.log" 2>&1; then
  say "ceph-bluestore-tool fsck --deep: clean ($(tail -n1 "$OUT/fsck.log"))"
else
  fail "ceph-bluestore-tool fsck --deep: $(tail -n3 "$OUT/fsck.log")"
fi

sq_log "5. the OSD again; kept read back"
t_restart=$(now)
ceph_osd_start 0
ceph_wait_osd 0 up 180
ceph_wait_clean 300
say "osd.0 up and every placement group active+clean $(since "$t_restart") s after its restart"
if fio_rbd verify-kept kept "$KEPT_SIZE" --verify_only=1; then
  say "kept: every block read back as written"
else
  fail "kept does not read back: $(tail -n3 "$OUT/verify-kept.err")"
fi

sq_log "6. the volume: closed cleanly, checked"
ceph_stop
losetup -d "$LOOP" 2>/dev/null || true
LOOP=""
sq_serve_stop osd0
if "$BIN" check "$SCR/osd0.sqz" >"$OUT/check.txt" 2>&1; then
  say "squeeze check osd0.sqz: clean"
else
  fail "squeeze check osd0.sqz: $(tail -n3 "$OUT/check.txt")"
fi
cp "$SCR"/log/*.log "$OUT/" 2>/dev/null || true
if ((FAILED)); then
  sq_table
  sq_die "some steps failed (see $OUT/summary.txt)"
fi
say "PASSED: the cap stopped the OSD, nothing acknowledged was lost, and it came back (results in $OUT)"
sq_table
