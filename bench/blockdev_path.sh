#!/usr/bin/env bash
# bench/blockdev_path.sh — which way to a kernel block device on a squeeze volume is fastest
# (issues 18 and 35). The paths (PATHS, any of):
#   ublk      /dev/ublkbN from `squeeze serve --ublk` (needs the kernel's ublk_drv module)
#   nbd       /dev/nbdN from the kernel's nbd client, `nbd-client -unix SOCK /dev/nbdN -C CORES`
#             (needs the kernel's nbd module and nbd-client)
#   fuse      a loop device on the server's own FUSE export (`squeeze serve --fuse-dir DIR`, a
#             loop device on DIR/vol: one hop from the engine)
#   nbdfuse   a loop device on libnbd's nbdfuse on the server's NBD socket (a second process,
#             an NBD round trip)
#   plain     a loop device on a sparse file on the same disk (no compression: the ceiling)
# and fio on each device (libaio, O_DIRECT): 128 KiB sequential writes then reads at QD32,
# 4 KiB random writes at QD32, W1's data (60% compressible per 4 KiB, refilled per I/O).
# The default PATHS, "fuse nbdfuse plain", runs where the kernel has neither module (this
# project's machine); where it has them, PATHS="ublk nbd fuse plain" compares the four. A path
# whose module is missing stops the run with a message saying so. In the test guest (a kernel
# with both modules, under emulation) bench/guest_path.sh runs the same comparison.
#
#   sudo bench/blockdev_path.sh                     # SIZE=2g, RUNTIME=20, REPS=1
#   PATHS="fuse nbdfuse" REPS=3 sudo bench/blockdev_path.sh
#   PATHS="ublk nbd fuse plain" sudo bench/blockdev_path.sh   # a host with ublk_drv and nbd
#
# Per path and job: MB/s (IOPS for 4 KiB), and CPU seconds per GiB written, whole machine
# (/proc/stat busy time) and the server's processes (squeeze serve, plus nbdfuse on that path,
# from /proc/PID/stat). One table row per path and job on stdout and in OUT/results.jsonl (table:
# OUT/table.md); raw fio JSON and server logs under OUT. The volume, the plain file and the
# mounts are in a scratch directory under SCRATCH_BASE, removed at exit.
# The whole run holds the bench lock (bench/README.md). Needs root, fio, losetup, fusermount3,
# and for their paths nbdfuse, nbd-client (Debian's nbd-client) and the modules.
#
# Env: PATHS ("fuse nbdfuse plain"), SIZE (2g), RUNTIME (20 s per job), REPS (1), OUT
#      (results/blockdev_path-<time>), SCRATCH_BASE (/tmp), BENCH_LOCK (/tmp/bench.lock), BIN (a
#      squeeze binary instead of building one), SQUEEZE_SERVE_ARGS.
set -euo pipefail

SQ_PROG=bench/blockdev_path.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PATHS=${PATHS:-fuse nbdfuse plain}
SIZE=${SIZE:-2g}
RUNTIME=${RUNTIME:-20}
REPS=${REPS:-1}

[[ $(id -u) == 0 ]] || sq_die "run as root (loop devices, FUSE mounts)"
for t in fio losetup flock python3 fusermount3; do
  command -v "$t" >/dev/null || sq_die "missing $t (apt-get install fio util-linux python3 fuse3)"
done
[[ " $PATHS " != *" nbdfuse "* ]] || command -v nbdfuse >/dev/null \
  || sq_die "missing nbdfuse (apt-get install nbdfuse), or leave it out of PATHS"
if [[ " $PATHS " == *" ublk "* ]]; then
  [[ -c /dev/ublk-control ]] || modprobe ublk_drv 2>/dev/null || true
  [[ -c /dev/ublk-control ]] || sq_die "PATHS has ublk, but this kernel ($(uname -r)) has no ublk_drv" \
    "module (modprobe ublk_drv failed; Linux 6.0 or later, CONFIG_BLK_DEV_UBLK): leave ublk out of" \
    "PATHS, or run bench/guest_path.sh (the test guest has it)"
fi
if [[ " $PATHS " == *" nbd "* ]]; then
  command -v nbd-client >/dev/null || sq_die "missing nbd-client (apt-get install nbd-client), or leave nbd out of PATHS"
  [[ -b /dev/nbd0 ]] || modprobe nbd 2>/dev/null || true
  [[ -b /dev/nbd0 ]] || sq_die "PATHS has nbd, but this kernel ($(uname -r)) has no nbd module" \
    "(modprobe nbd failed, no /dev/nbd0): leave nbd out of PATHS, or run bench/guest_path.sh" \
    "(the test guest has it)"
fi
sq_lock
sq_bin
SCR=$(mktemp -d "${SCRATCH_BASE:-/tmp}/squeeze-blockdev.XXXXXX")
PIDS=()    # the server's processes, whose CPU counts: squeeze serve, and nbdfuse on that path
NBDFUSE=""
LOOP=""    # the loop device of the fuse, nbdfuse and plain paths
NBD=""     # the nbd path's /dev/nbdN
DEV=""     # the device fio runs on
cleanup() {
  [[ -z $LOOP ]] || losetup -d "$LOOP" 2>/dev/null || true
  LOOP=""
  [[ -z $NBD ]] || nbd-client -d "$NBD" >/dev/null 2>&1 || true
  NBD=""
  DEV=""
  sq_serve_stop srv
  [[ -z $NBDFUSE ]] || { kill "$NBDFUSE" 2>/dev/null || true; wait "$NBDFUSE" 2>/dev/null || true; }
  NBDFUSE=""
  PIDS=()
  for m in "$SCR/fuse" "$SCR/nbdfuse"; do
    mountpoint -q "$m" 2>/dev/null && { fusermount3 -u "$m" 2>/dev/null || umount -l "$m" || true; }
  done
  rm -rf "$SCR"
}
sq_on_exit cleanup
sq_out blockdev_path "$SCR"
cat "$OUT/machine.txt" >&2

wait_for() { # wait_for FILE
  local i
  for ((i = 0; i < 300; i++)); do [[ -e $1 ]] && return; sleep 0.1; done
  sq_die "$1 never appeared"
}

free_nbd() { # the first /dev/nbdN with no connection
  local d
  for d in /sys/block/nbd*; do
    [[ -e $d/pid || $(cat "$d/size") != 0 ]] || { echo "/dev/${d##*/}"; return; }
  done
  sq_die "no free /dev/nbdN"
}

setup() { # setup PATH: start what the path needs; sets DEV (and LOOP or NBD), PIDS
  local path=$1 file="" i
  rm -rf "$SCR"; mkdir -p "$SCR"
  case $path in
    ublk)
      # shellcheck disable=SC2086
      sq_serve_start srv "$OUT/$path.server.log" -- \
        --socket "$SCR/nbd.sock" --size 16G --ublk ${SQUEEZE_SERVE_ARGS:-} "$SCR/vol.sqz"
      PIDS+=("$(sq_serve_pid srv)")
      for ((i = 0; i < 100; i++)); do
        DEV=$(sed -n 's/^ *block device: \(\/dev\/ublkb[0-9]*\) .*/\1/p' "$OUT/$path.server.log" | tail -n1)
        [[ -z $DEV ]] || break
        sleep 0.1
      done
      [[ -b $DEV ]] || sq_die "ublk: squeeze serve --ublk named no block device (log $OUT/$path.server.log)" ;;
    nbd)
      # shellcheck disable=SC2086
      sq_serve_start srv "$OUT/$path.server.log" --ready "$SCR/nbd.sock" -- \
        --socket "$SCR/nbd.sock" --size 16G ${SQUEEZE_SERVE_ARGS:-} "$SCR/vol.sqz"
      PIDS+=("$(sq_serve_pid srv)")
      NBD=$(free_nbd)
      # One connection per core (the server offers multi-conn), ext4's 4 KiB blocks.
      nbd-client -unix "$SCR/nbd.sock" "$NBD" -N vol -C "$(nproc)" -b 4096 -t 120 \
        >"$OUT/$path.nbd-client.log" 2>&1 || sq_die "nbd-client failed: $(tail -n3 "$OUT/$path.nbd-client.log")"
      DEV=$NBD ;;
    fuse)
      # shellcheck disable=SC2086
      sq_serve_start srv "$OUT/$path.server.log" --ready "$SCR/fuse/vol" -- \
        --socket "$SCR/nbd.sock" --size 16G --fuse-dir "$SCR/fuse" ${SQUEEZE_SERVE_ARGS:-} "$SCR/vol.sqz"
      PIDS+=("$(sq_serve_pid srv)")
      file=$SCR/fuse/vol ;;
    nbdfuse)
      # shellcheck disable=SC2086
      sq_serve_start srv "$OUT/$path.server.log" --ready "$SCR/nbd.sock" -- \
        --socket "$SCR/nbd.sock" --size 16G ${SQUEEZE_SERVE_ARGS:-} "$SCR/vol.sqz"
      PIDS+=("$(sq_serve_pid srv)")
      mkdir -p "$SCR/nbdfuse"
      nbdfuse "$SCR/nbdfuse/vol" "nbd+unix:///?socket=$SCR/nbd.sock" >"$OUT/$path.nbdfuse.log" 2>&1 &
      NBDFUSE=$!
      PIDS+=("$NBDFUSE")
      wait_for "$SCR/nbdfuse/vol"
      file=$SCR/nbdfuse/vol ;;
    plain)
      truncate -s 16G "$SCR/plain.img"
      file=$SCR/plain.img ;;
    *) sq_die "unknown path $path (ublk, nbd, fuse, nbdfuse, plain)" ;;
  esac
  [[ -n $file ]] || return 0
  # Direct I/O on the loop device (as bench/pg_fillfactor.sh does): no page cache between the
  # loop device and the file, so every path measures its own stack, not the host's memory.
  LOOP=$(losetup -f --show --direct-io=on "$file")
  DEV=$LOOP
  [[ $(losetup -nl -O DIO "$LOOP" | tr -d " ") == 1 ]] || sq_log "$path: the loop device fell back to buffered I/O"
}

cpu_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
proc_cpu() { # summed utime+stime ticks of the PIDs in PIDS
  local t=0 p
  for p in "${PIDS[@]}"; do
    [[ -r /proc/$p/stat ]] && t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat")))
  done
  echo "$t"
}

job() { # job PATH NAME RW BS: one fio job on $DEV, one result line
  local path=$1 name=$2 rw=$3 bs=$4 tag b0 b1 p0 p1
  tag=$OUT/r$rep-$path-$name
  b0=$(cpu_busy); p0=$(proc_cpu)
  fio --name="$name" --filename="$DEV" --rw="$rw" --bs="$bs" --iodepth=32 --ioengine=libaio \
    --direct=1 --size="$SIZE" --runtime="$RUNTIME" --time_based=0 --buffer_compress_percentage=60 \
    --buffer_compress_chunk=4k --refill_buffers --randrepeat=1 --output-format=json >"$tag.json" \
    2>"$tag.err" || sq_die "fio $name on $path failed: $(tail -n3 "$tag.err")"
  b1=$(cpu_busy); p1=$(proc_cpu)
  python3 - "$tag.json" "$path" "$name" "$((b1 - b0))" "$((p1 - p0))" "$(getconf CLK_TCK)" "$rep" <<'EOF' | sq_emit
import json, sys
path, tag, name, busy, proc, hz, rep = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
t = open(path).read()
j, _ = json.JSONDecoder().raw_decode(t[t.index("{"):])
job = j["jobs"][0]
side = job["read"] if job["read"]["io_bytes"] > job["write"]["io_bytes"] else job["write"]
gib = side["io_bytes"] / 2**30
print(f"{rep}\t{tag}\t{name}\t{side['bw_bytes'] / 1e6:.1f} MB/s\t{side['iops']:.0f} IOPS\t"
      f"machine {busy / hz / gib:.2f} CPU s/GiB\tserver {proc / hz / gib:.2f} CPU s/GiB")
print(json.dumps({"rep": int(rep), "path": tag, "job": name, "MB/s": side["bw_bytes"] / 1e6,
                  "IOPS": side["iops"], "gib": gib, "machine_cpu_s_per_gib": busy / hz / gib,
                  "server_cpu_s_per_gib": proc / hz / gib}))
EOF
}

printf 'rep\tpath\tjob\tbandwidth\tIOPS\tmachine CPU\tserver CPU\n'
for ((rep = 1; rep <= REPS; rep++)); do
  for path in $PATHS; do
    setup "$path"
    job "$path" seqwrite-128k write 128k
    job "$path" seqread-128k read 128k
    job "$path" randwrite-4k randwrite 4k
    cleanup
  done
done
sq_table
sq_log "results in $OUT (table.md, results.jsonl; raw fio JSON, server logs)"
