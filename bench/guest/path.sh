#!/bin/bash
# bench/guest/path.sh — the block device path's own cost, measured INSIDE the test guest
# (issue 35). bench/guest_path.sh runs it (scripts/guest/run.sh BIN bench/guest/path.sh OUT);
# it is not a test (tests/guest/), so scripts/guest/test.sh does not run it.
#
# Four ways to a kernel block device, each measured in the same boot with fio on the device:
#   plain   a loop device (direct I/O) on a sparse file on the guest's virtio disk: no server
#   ublk    /dev/ublkb0 from `squeeze serve --ublk`: no NBD client, no loop device
#   nbd     /dev/nbd0 from the kernel's nbd client (`nbd-client -unix SOCK /dev/nbd0 -C 2`)
#   fuse    a loop device (direct I/O) on squeeze's FUSE export (`squeeze serve --fuse-dir`)
#   fuse-buffered  the same with the server's backing file written through the page cache
#           (SQUEEZE_IO=buffered), as `serve --ublk` wrote it until 2026-11-27: not in the
#           default PATHS
#   ublk-buffered  ublk with the backing file written through the page cache (SQUEEZE_IO=
#           buffered): the ublk server as it was until 2026-11-27; not in the default PATHS
# Every squeeze volume is made with --mode none, so that compression does not hide the path.
# fio jobs (libaio, O_DIRECT, QD32): 128 KiB sequential write of SIZE (once, whole), then for
# RUNTIME seconds each a 128 KiB sequential read, 4 KiB random writes and 4 KiB random reads
# within those SIZE bytes.
#
# Per path and job it writes to $GUEST_OUT: fio's JSON (REP-PATH-JOB.json) and one line of
# results.tsv: rep path job, the guest's busy CPU ticks (/proc/stat, every CPU: fio, the kernel,
# the server), the server's ticks (/proc/PID/stat utime+stime of squeeze serve; 0 for plain),
# CLK_TCK, and the bytes the device moved (/sys/block/NAME/stat), all counted from the first
# sector the job moves to fio's exit (fio's own start costs seconds of CPU under emulation).
# bench/guest_path.sh turns them into MB/s, IOPS (fio's) and CPU seconds per GiB. It prints a
# line per job and exits non-zero when a path could not be set up or fio failed.
#
# Environment (run.sh passes SQUEEZE_TEST_*): SQUEEZE_TEST_PATHS ("plain ublk nbd fuse"),
# SQUEEZE_TEST_SIZE (fio's region, written whole first, 512M), SQUEEZE_TEST_RUNTIME
# (seconds of each later job, 20), SQUEEZE_TEST_REPS (1: rounds over every path in this boot),
# SQUEEZE_TEST_JOBS ("seqwrite-128k seqread-128k randwrite-4k randread-4k"),
# SQUEEZE_TEST_PROFILE (1: each job's tasks' CPU before and after, REP-PATH-JOB.tasks0/1).
set -u
BIN=${SQUEEZE_BIN:-squeeze}
OUT=${GUEST_OUT:-/tmp/path-out}
PATHS=${SQUEEZE_TEST_PATHS:-plain ublk nbd fuse}
SIZE=${SQUEEZE_TEST_SIZE:-512M}
RUNTIME=${SQUEEZE_TEST_RUNTIME:-20}
REPS=${SQUEEZE_TEST_REPS:-1}
JOBS=${SQUEEZE_TEST_JOBS:-seqwrite-128k seqread-128k randwrite-4k randread-4k}
W=/var/tmp/path-bench
VOLSIZE=8G
HZ=$(getconf CLK_TCK)

T0=$(date +%s)
SERVER_PID=
DEV=
LOOP=
errors=0
say() { echo "[$(($(date +%s) - T0)) s] $*"; }
err() {
  errors=$((errors + 1))
  echo "FAIL: $*"
}

# serve LOG READY ARGS...: squeeze serve ARGS in the background; waits until READY (a path, or
# "log:TEXT" for a line of the log) is there. The PID in SERVER_PID.
serve() {
  local log=$1 ready=$2 _
  shift 2
  SQUEEZE_IO=${SERVE_IO:-direct} "$BIN" serve "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    if [[ $ready == log:* ]]; then
      grep -q "${ready#log:}" "$log" && return 0
    else
      [[ -e $ready ]] && return 0
    fi
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  tail -n 20 "$log" | sed 's/^/  serve: /'
  return 1
}
stop_server() {
  [[ -n $SERVER_PID ]] || return 0
  kill -TERM "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID"
  local rc=$?
  ((rc == 0)) || err "squeeze serve exited $rc on SIGTERM"
  SERVER_PID=
}
teardown() {
  [[ -z $LOOP ]] || losetup -d "$LOOP" 2>/dev/null
  LOOP=
  [[ ! -e /sys/block/nbd0/pid ]] || nbd-client -d /dev/nbd0 >/dev/null 2>&1
  stop_server
  if mountpoint -q "$W/fuse" 2>/dev/null; then fusermount3 -u "$W/fuse" 2>/dev/null || umount -l "$W/fuse"; fi
  DEV=
  rm -rf "$W"
}

# setup PATH: bring the path's device up; sets DEV (and LOOP, SERVER_PID).
setup() {
  local path=$1
  rm -rf "$W" && mkdir -p "$W"
  if [[ $path != plain ]]; then
    "$BIN" create --size "$VOLSIZE" --mode none "$W/vol.sqz" >/dev/null || return 1
  fi
  case $path in
    plain)
      truncate -s "$VOLSIZE" "$W/plain.img"
      LOOP=$(losetup -f --show --direct-io=on "$W/plain.img") || return 1
      DEV=$LOOP
      ;;
    ublk | ublk-buffered)
      # ublk-buffered: the backing file written through the page cache (as every ublk
      # server did before the queues wrote the pool out before answering a write).
      [[ -c /dev/ublk-control ]] || modprobe ublk_drv || return 1
      SERVE_IO=direct
      [[ $path == ublk ]] || SERVE_IO=buffered
      serve "$OUT/$rep-$path.serve.log" "log:block device: /dev/ublkb0" \
        --ublk --ublk-id 0 "$W/vol.sqz" || return 1
      SERVE_IO=
      DEV=/dev/ublkb0
      ;;
    nbd)
      [[ -b /dev/nbd0 ]] || modprobe nbd || return 1
      serve "$OUT/$rep-nbd.serve.log" "$W/vol.ctl" --socket "$W/nbd.sock" "$W/vol.sqz" || return 1
      # As tests/guest/nbd_client.sh connects: two connections (one per vCPU), 4 KiB blocks.
      nbd-client -unix "$W/nbd.sock" /dev/nbd0 -N vol -C 2 -b 4096 -t 120 >"$OUT/$rep-nbd.client.log" 2>&1 || return 1
      DEV=/dev/nbd0
      ;;
    fuse | fuse-buffered)
      # fuse-buffered: the server writes its backing file through the page cache, as a ublk
      # server did until 2026-11-27: the FUSE export with the old ublk server's I/O mode.
      SERVE_IO=direct
      [[ $path == fuse ]] || SERVE_IO=buffered
      serve "$OUT/$rep-$path.serve.log" "$W/fuse/vol" \
        --socket "$W/nbd.sock" --fuse-dir "$W/fuse" "$W/vol.sqz" || return 1
      SERVE_IO=
      LOOP=$(losetup -f --show --direct-io=on "$W/fuse/vol") || return 1
      DEV=$LOOP
      ;;
    *)
      echo "unknown path $path"
      return 1
      ;;
  esac
  if [[ -n $LOOP && $(losetup -nl -O DIO "$LOOP" | tr -d ' ') != 1 ]]; then
    say "$path: the loop device fell back to buffered I/O"
  fi
  [[ -b $DEV ]] && (($(blockdev --getsize64 "$DEV") > 0))
}

# The counters are read with bash builtins only: under emulation a fork costs tens of
# milliseconds, and the sampling loop below must notice a job's first sector at once.
# Each sets REPLY.
# cpu_busy: the guest's busy ticks, every CPU (user nice system irq softirq).
cpu_busy() {
  local _cpu user nice system _idle _iowait irq softirq _rest
  read -r _cpu user nice system _idle _iowait irq softirq _rest </proc/stat
  REPLY=$((user + nice + system + irq + softirq))
}
# server_cpu: squeeze serve's utime+stime ticks (0 without a server).
server_cpu() {
  local st f
  REPLY=0
  if [[ -n $SERVER_PID && -r /proc/$SERVER_PID/stat ]]; then
    read -r st <"/proc/$SERVER_PID/stat"
    # The fields after the command (which may hold spaces): utime and stime are 12 and 13.
    read -r -a f <<<"${st##*) }"
    REPLY=$((f[11] + f[12]))
  fi
}

# dev_sectors: sectors read and written on DEV so far ($DEV_STAT: /sys/block/NAME/stat).
dev_sectors() {
  local _rio _rm rsec _rt _wio _wm wsec _rest
  read -r _rio _rm rsec _rt _wio _wm wsec _rest <"$DEV_STAT"
  REPLY=$((rsec + wsec))
}
# tasks_snapshot FILE: with SQUEEZE_TEST_PROFILE=1, every task's CPU so far into FILE (one line
# a task: pid tid comm utime stime, ticks), then /proc/stat's cpu, ctxt and intr lines: where the
# guest's CPU went over a job, by process, thread and kernel thread (bench/guest_path.sh's
# profile.md), and the IPIs. Builtins only; taken before the job's window opens and after it closes.
tasks_snapshot() {
  [[ ${SQUEEZE_TEST_PROFILE:-0} == 1 ]] || return 0
  local t st comm f line rest pid tid
  {
    for t in /proc/[0-9]*/task/[0-9]*/stat; do
      { read -r st <"$t"; } 2>/dev/null || continue
      comm=${st#*(}
      comm=${comm%)*}
      read -r -a f <<<"${st##*) }"
      tid=${t%/stat}
      tid=${tid##*/}
      pid=${t#/proc/}
      pid=${pid%%/*}
      echo "task $pid $tid ${comm// /_} ${f[11]} ${f[12]}"
    done
    while read -r line rest; do
      case $line in cpu) echo "cpu $rest" ;; ctxt | intr) echo "$line ${rest%% *}" ;; esac
    done </proc/stat
    while read -r line rest; do
      case $line in RES: | CAL: | TLB: | LOC:) echo "irq ${line%:} $rest" ;; esac
    done </proc/interrupts
  } >"$1"
}

# nap: sleep 50 ms without a fork (a read that times out on a pipe nobody writes).
exec {NAP}<> <(:)
nap() { read -r -t 0.05 -u "$NAP" _ || true; }

# job PATH NAME: one fio job on DEV, one line of results.tsv. The CPU counts from the moment
# the device's first sector moves to fio's exit, and the bytes are the device's own sectors
# in that window: fio's start (seconds of CPU under emulation) is not the path's cost.
job() {
  local path=$1 name=$2 rw bs b0 b1 p0 p1 s0 s1 s fio_pid tag timed=(--time_based --runtime="$RUNTIME")
  case $name in
    seqwrite-128k) rw=write bs=128k timed=() ;; # writes the region once: what the reads read
    seqread-128k) rw=read bs=128k ;;
    randwrite-4k) rw=randwrite bs=4k ;;
    randread-4k) rw=randread bs=4k ;;
    *)
      err "unknown job $name"
      return
      ;;
  esac
  tag=$OUT/$rep-$path-$name
  sync
  echo 3 >/proc/sys/vm/drop_caches
  DEV_STAT=/sys/block/$(basename "$(readlink -f "$DEV")")/stat
  dev_sectors
  s=$REPLY
  fio --name="$name" --filename="$DEV" --rw="$rw" --bs="$bs" --iodepth=32 --ioengine=libaio \
    --direct=1 --size="$SIZE" "${timed[@]}" --randrepeat=1 --output-format=json \
    >"$tag.json" 2>"$tag.err" &
  fio_pid=$!
  while kill -0 "$fio_pid" 2>/dev/null; do
    dev_sectors
    ((REPLY == s)) || break
    nap
  done
  tasks_snapshot "$tag.tasks0"
  cpu_busy && b0=$REPLY
  server_cpu && p0=$REPLY
  dev_sectors && s0=$REPLY
  if ! wait "$fio_pid"; then
    err "fio $name on $path: $(tail -n 3 "$tag.err")"
    return
  fi
  cpu_busy && b1=$REPLY
  server_cpu && p1=$REPLY
  dev_sectors && s1=$REPLY
  tasks_snapshot "$tag.tasks1"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rep" "$path" "$name" "$((b1 - b0))" "$((p1 - p0))" "$HZ" \
    "$(((s1 - s0) * 512))" >>"$OUT/results.tsv"
  say "$path $name: $(awk -v b=$((b1 - b0)) -v p=$((p1 - p0)) -v hz="$HZ" -v n=$(((s1 - s0) * 512)) \
    'BEGIN { printf "%.0f MiB in the window, guest busy %.1f s, server %.1f s", n / 2^20, b / hz, p / hz }')"
}

mkdir -p "$OUT"
: >"$OUT/results.tsv"
say "squeeze $("$BIN" --version | cut -d' ' -f2), kernel $(uname -r), $(nproc) vCPUs," \
  "paths: $PATHS, size $SIZE, runtime ${RUNTIME}s, reps $REPS"
{
  echo "kernel: $(uname -r)"
  echo "vcpus: $(nproc)"
  echo "mem: $(awk '/MemTotal/ { print int($2 / 1024) " MiB" }' /proc/meminfo)"
  echo "squeeze: $("$BIN" --version)"
  echo "fio: $(fio --version)"
  echo "nbd-client: $(nbd-client -V 2>&1 | grep -o '[0-9][0-9.]*' | head -n1)"
  echo "disk: $(df -h /var/tmp | tail -n1)"
} >"$OUT/guest.txt"
[[ -e /dev/loop-control ]] || modprobe loop || err "modprobe loop failed"
for ((rep = 1; rep <= REPS; rep++)); do
  for path in $PATHS; do
    if ! setup "$path"; then
      err "$path: could not set the device up"
      teardown
      continue
    fi
    say "$path: $DEV up"
    for name in $JOBS; do job "$path" "$name"; done
    # Where the server's CPU went over the path's jobs: its threads' utime+stime by name.
    if [[ -n $SERVER_PID ]]; then
      for t in /proc/"$SERVER_PID"/task/*/stat; do
        read -r st <"$t"
        comm=${st#*(}
        comm=${comm%)*}
        read -r -a f <<<"${st##*) }"
        echo "$((f[11] + f[12])) ${comm// /_}"
      done | awk '{ sub(/[-_]?[0-9]+$/, "", $2); n[$2] += $1 } END { for (k in n) print n[k], k }' |
        sort -rn >"$OUT/$rep-$path.threads.txt"
    fi
    teardown
  done
done
say "done, $errors errors"
((errors == 0))
