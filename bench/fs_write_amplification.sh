#!/usr/bin/env bash
# bench/fs_write_amplification.sh — squeeze's write amplification under a real file system:
# xfstests' fsx and fsstress on ext4 on a squeeze volume (issue 15's measurement).
#
#   sudo bench/fs_write_amplification.sh --bin target/release/squeeze           # default run (about 15 minutes on 2 cores)
#   sudo bench/fs_write_amplification.sh --bin /tmp/sq-old --quick --label old  # about 2 minutes
# The whole run holds the bench lock (bench/README.md; run under `flock /tmp/bench.lock` it goes
# on under that hold).
#
# What it does: `squeeze create` a volume (--size, default 4G) in a fresh work directory,
# `squeeze serve` it on a unix socket (with its control socket), attach it as a kernel block
# device through nbdfuse (a FUSE file backed by NBD) plus a loop device (this machine has no
# kernel nbd module), mkfs.ext4, mount, then run fsx (one process, one file) and fsstress
# (--fsstress-procs processes) at the same time, each bounded by an op count (and by a
# wall-clock cap, --time-limit, as a safety net: a run that hits it is reported). Then sync,
# unmount, `e2fsck -fn` the device (the file system must be clean), detach loop and nbdfuse
# (both flush), and read the counters from the running server's control socket
# (`squeeze stats --json CTL`): client bytes written, log bytes, checkpoint bytes, checkpoints,
# cleaner bytes moved (part of the log bytes), squeeze's write_amplification ((log + checkpoint + pre-written
# bytes) / compressed client bytes), and, when the
# binary has them, checkpoint_base_bytes / checkpoint_delta_bytes / checkpoint_deltas /
# open_seconds. Finally the server is stopped (SIGTERM, clean close) and the volume reopened
# offline once (`squeeze stats --json VOL`) for its open_seconds.
# Everything (mount, loop, nbdfuse, server, work directory) is torn down by an EXIT trap, on
# failure too. If fsx or fsstress FAILS (an fsx data miscompare is a squeeze bug until shown
# otherwise), the work directory with the volume file and fsx's logs (.fsxlog/.fsxgood/.fsxops)
# is KEPT and its path printed; exit status 1.
#
# Options:
#   --bin PATH            squeeze binary (default: $BIN, else target/release/squeeze of this
#                         checkout, built)
#   --quick               about 2 minutes: fsx 20000 ops, fsstress 4 x 2000 ops, 240 s cap
#   --size SIZE           volume logical size (default 4G)
#   --fsx-ops N           fsx operations (default 200000)
#   --fsx-args "ARGS"     fsx options (default "-q -l 268435456 -o 1048576")
#   --fsstress-ops N      fsstress operations per process (default 20000)
#   --fsstress-procs N    fsstress processes (default 4)
#   --seed N              seed of fsx (-S) and fsstress (-s) (default 1)
#   --time-limit S        wall-clock cap of the workload in seconds (default 1800)
#   --label NAME          name of the row in the output (default: the binary's file name)
#   --settle S            after the device is detached, leave the server idle S seconds before
#                         reading its counters (default 0), so that what the idle cleaner does
#                         (its copies, and the space they give back) is in the figures
#   --out DIR             where results go (default: $OUT, else results/fs_write_amplification-<time>)
#   --work DIR            the work directory (volume, sockets, mounts; must not exist; default
#                         a new directory under /var/tmp), removed at the end unless a check failed
#
# Output: one markdown table row on stdout (header with it) and in DIR/table.md, DIR/result.json
# (the numbers; the same object is the line of DIR/results.jsonl), DIR/stats.json (the control
# socket's full answer), DIR/reopen.json, DIR/fsx.out, DIR/fsstress.out, DIR/serve.log, DIR/cmd.txt.
#
# fsx and fsstress come from xfstests, which is GPL and is NOT part of this repository: the
# script builds the two programs (ltp/fsx.c and ltp/fsstress.c only, direct gcc with a minimal
# config.h, no autotools) into a cache directory outside the repo and reuses them:
#   XFSTESTS_SRC    an xfstests source tree (a directory holding ltp/fsx.c), or a git URL or
#                   git directory to clone, e.g.
#                   XFSTESTS_SRC=https://git.kernel.org/pub/scm/fs/xfs/xfstests-dev.git
#                   Needed only the first time (or after deleting the cache).
#   XFSTESTS_CACHE  the cache (default $XDG_CACHE_HOME/squeeze-xfstests, or
#                   /var/tmp/squeeze-xfstests without XDG_CACHE_HOME); binaries in $XFSTESTS_CACHE/bin
# Build needs gcc and the Debian packages xfslibs-dev libaio-dev liburing-dev; the run needs
# libnbd-bin (nbdfuse), fuse3, e2fsprogs, util-linux. As root they are apt-get installed when
# missing (INSTALL=0 refuses). Needs root (loop devices, mount).
set -euo pipefail

SQ_PROG=bench/fs_write_amplification.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN=${BIN:-}
QUICK=0
SIZE=4G
FSX_OPS=200000
FSX_ARGS="-q -l 268435456 -o 1048576"
FSS_OPS=20000
FSS_PROCS=4
SEED=1
TIME_LIMIT=1800
LABEL=""
SETTLE=0
WORK=""
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --size) SIZE=$2; shift 2 ;;
    --fsx-ops) FSX_OPS=$2; FSX_OPS_SET=1; shift 2 ;;
    --fsx-args) FSX_ARGS=$2; shift 2 ;;
    --fsstress-ops) FSS_OPS=$2; FSS_OPS_SET=1; shift 2 ;;
    --fsstress-procs) FSS_PROCS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --time-limit) TIME_LIMIT=$2; TIME_SET=1; shift 2 ;;
    --label) LABEL=$2; shift 2 ;;
    --settle) SETTLE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) sq_die "unknown option $1 (--help)" ;;
  esac
done
if ((QUICK)); then
  [[ -n ${FSX_OPS_SET:-} ]] || FSX_OPS=20000
  [[ -n ${FSS_OPS_SET:-} ]] || FSS_OPS=2000
  [[ -n ${TIME_SET:-} ]] || TIME_LIMIT=240
fi
[[ $(id -u) == 0 ]] || sq_die "needs root (loop devices, mount)"

# --- tools -------------------------------------------------------------------------------
need_pkgs() { # need_pkgs "test:package ..." — test is a command name or an absolute file path
  local t pkgs=() what
  for t in $1; do
    what=${t%%:*}
    if [[ $what == /* ]]; then [[ -e $what ]] && continue; else command -v "$what" >/dev/null 2>&1 && continue; fi
    pkgs+=("${t##*:}")
  done
  ((${#pkgs[@]})) || return 0
  mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
  if [[ ${INSTALL:-1} != 0 ]] && command -v apt-get >/dev/null; then
    sq_log "installing ${pkgs[*]} (apt-get; INSTALL=0 to refuse)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >&2 \
      || { DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 \
           && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >&2; } \
      || sq_die "apt-get install failed; run: apt-get update && apt-get install -y ${pkgs[*]}"
  else
    sq_die "missing: ${pkgs[*]}; run: apt-get update && apt-get install -y ${pkgs[*]}"
  fi
}
need_pkgs "nbdfuse:libnbd-bin fusermount3:fuse3 mkfs.ext4:e2fsprogs e2fsck:e2fsprogs
  losetup:mount flock:util-linux timeout:coreutils python3:python3"
sq_lock

# --- fsx and fsstress from xfstests, built into the cache -------------------------------------
XFSTESTS_CACHE=${XFSTESTS_CACHE:-${XDG_CACHE_HOME:+$XDG_CACHE_HOME/squeeze-xfstests}}
XFSTESTS_CACHE=${XFSTESTS_CACHE:-/var/tmp/squeeze-xfstests}
FSX=$XFSTESTS_CACHE/bin/fsx
FSSTRESS=$XFSTESTS_CACHE/bin/fsstress

build_xfstests() {
  local src=${XFSTESTS_SRC:-} cfg flags=() libs=(-lpthread -lm) p
  if [[ -z $src ]]; then
    sq_die "fsx/fsstress are not built yet in $XFSTESTS_CACHE/bin and XFSTESTS_SRC is unset.
  xfstests is not part of this repository; point XFSTESTS_SRC at an xfstests source tree or a
  git URL once, e.g.
    XFSTESTS_SRC=https://git.kernel.org/pub/scm/fs/xfs/xfstests-dev.git $0 ...
  (or XFSTESTS_SRC=/path/to/xfstests). Only ltp/fsx.c and ltp/fsstress.c are built, into
  \$XFSTESTS_CACHE (now $XFSTESTS_CACHE)."
  fi
  need_pkgs "gcc:gcc git:git /usr/include/xfs/xfs.h:xfslibs-dev /usr/include/libaio.h:libaio-dev
    /usr/include/liburing.h:liburing-dev"
  mkdir -p "$XFSTESTS_CACHE/bin"
  if [[ ! -f $src/ltp/fsx.c ]]; then
    if [[ ! -f $XFSTESTS_CACHE/src/ltp/fsx.c ]]; then
      sq_log "cloning xfstests from $src into $XFSTESTS_CACHE/src"
      rm -rf "$XFSTESTS_CACHE/src"
      git clone -q --depth 1 "$src" "$XFSTESTS_CACHE/src" 2>/dev/null \
        || git clone -q "$src" "$XFSTESTS_CACHE/src" \
        || sq_die "could not clone XFSTESTS_SRC=$src"
    fi
    src=$XFSTESTS_CACHE/src
  fi
  [[ -f $src/ltp/fsx.c && -f $src/ltp/fsstress.c && -f $src/src/global.h ]] \
    || sq_die "$src is not an xfstests tree (no ltp/fsx.c, ltp/fsstress.c, src/global.h)"
  # The config.h autoconf would write on Debian/glibc, limited to what fsx and fsstress read.
  cfg=$XFSTESTS_CACHE/cfg
  mkdir -p "$cfg"
  {
    for p in XFS_XFS_H SYS_TYPES_H SYS_STAT_H SYS_STATVFS_H SYS_TIME_H SYS_IOCTL_H SYS_WAIT_H \
      MALLOC_H DIRENT_H STDLIB_H UNISTD_H STRING_H ERR_H LINUX_FALLOC_H LINUX_FIEMAP_H \
      SYS_PRCTL_H SYS_MMAN_H FCNTL_H ERRNO_H STRINGS_H SYS_PARAM_H SYS_XATTR_H RENAMEAT2 \
      SYS_FCNTL_H TIME_H LIBGEN_H ASSERT_H; do
      echo "#define HAVE_$p 1"
    done
  } >"$cfg/config.h"
  # xfslibs-dev older than 6.10 lacks XFS_IOC_EXCHANGE_RANGE: xfstests then uses its own.
  grep -q XFS_IOC_EXCHANGE_RANGE /usr/include/xfs/xfs_fs.h 2>/dev/null \
    || flags+=(-DNEED_INTERNAL_XFS_IOC_EXCHANGE_RANGE)
  flags+=(-DAIO -DURING -DFALLOCATE -DHAVE_COPY_FILE_RANGE)
  libs+=(-laio -luring)
  for p in fsx fsstress; do
    sq_log "building $p from $src"
    gcc -O2 -g -D_GNU_SOURCE "${flags[@]}" -I"$cfg" -I"$src/src" -I"$src/include" \
      "$src/ltp/$p.c" -o "$XFSTESTS_CACHE/bin/$p.tmp" "${libs[@]}" \
      >"$XFSTESTS_CACHE/build-$p.log" 2>&1 \
      || sq_die "building $p failed: see $XFSTESTS_CACHE/build-$p.log"
    mv "$XFSTESTS_CACHE/bin/$p.tmp" "$XFSTESTS_CACHE/bin/$p"
  done
  (git -C "$src" rev-parse HEAD 2>/dev/null || echo "$src") >"$XFSTESTS_CACHE/bin/SOURCE"
}
[[ -x $FSX && -x $FSSTRESS ]] || build_xfstests

# --- the binary -------------------------------------------------------------------------------
sq_bin
LABEL=${LABEL:-$(basename "$BIN")}
if [[ -n $WORK ]]; then
  [[ ! -e $WORK ]] || sq_die "$WORK exists (give a fresh --work)"
  mkdir -p "$WORK"
else
  WORK=$(mktemp -d /var/tmp/squeeze-fs-wa.XXXXXX)
fi
WORK=$(readlink -f "$WORK")
mkdir -p "$WORK"/{fuse,mnt}

# --- teardown ---------------------------------------------------------------------------------
LOOP="" FUSE_UP=0 MOUNTED=0 KEEP=0 fsx_pid="" fss_pid=""
cleanup() {
  local p
  for p in $fsx_pid $fss_pid; do # the workload's `timeout` passes TERM on to fsx/fsstress
    kill -0 "$p" 2>/dev/null && { kill -TERM "$p"; wait "$p"; }
  done
  if ((MOUNTED)); then umount "$WORK/mnt" || umount -l "$WORK/mnt"; fi
  [[ -n $LOOP ]] && losetup -d "$LOOP"
  if ((FUSE_UP)); then fusermount3 -u "$WORK/fuse" || fusermount3 -uz "$WORK/fuse"; fi
  SQ_SERVE_STOP_SECS=10 sq_serve_stop_all
  if ((KEEP)); then
    sq_log "KEPT for analysis: $WORK (volume file, fsx logs)"
  else
    rm -rf "$WORK"
  fi
}
sq_on_exit cleanup

sq_out fs_write_amplification "$WORK"
CMD="$0 --bin $BIN --size $SIZE --fsx-ops $FSX_OPS --fsx-args \"$FSX_ARGS\" --fsstress-ops $FSS_OPS --fsstress-procs $FSS_PROCS --seed $SEED --time-limit $TIME_LIMIT --settle $SETTLE${SQUEEZE_SERVE_ARGS:+ (SQUEEZE_SERVE_ARGS=$SQUEEZE_SERVE_ARGS)}"
echo "$CMD" >"$OUT/cmd.txt"
echo "xfstests: $(cat "$XFSTESTS_CACHE/bin/SOURCE" 2>/dev/null || echo '?')" >>"$OUT/machine.txt"

# --- volume, server, block device, file system -----------------------------------------------------
VOL=$WORK/vol.sqz
"$BIN" create --size "$SIZE" "$VOL" >&2
# shellcheck disable=SC2086 # SQUEEZE_SERVE_ARGS is a list of options
sq_serve_start srv "$OUT/serve.log" --ready "$WORK/nbd.sock" --ready "$WORK/ctl.sock" -- \
  --socket "$WORK/nbd.sock" --control "$WORK/ctl.sock" ${SQUEEZE_SERVE_ARGS:-} "$VOL"
SERVE_PID=$(sq_serve_pid srv)
nbdfuse "$WORK/fuse/nbd" --unix "$WORK/nbd.sock" &
FUSE_UP=1
for _ in $(seq 100); do [[ -e $WORK/fuse/nbd ]] && break; sleep 0.1; done
[[ -e $WORK/fuse/nbd ]] || sq_die "nbdfuse did not come up"
LOOP=$(losetup -f --show "$WORK/fuse/nbd")
sq_log "volume $VOL served by pid $SERVE_PID, nbdfuse $WORK/fuse/nbd, loop $LOOP"
mkfs.ext4 -q -F "$LOOP" >&2
mount "$LOOP" "$WORK/mnt"
MOUNTED=1
mkdir -p "$WORK/mnt/fsstress" "$WORK/fsxlogs"

# --- workload ---------------------------------------------------------------------------------
sq_log "fsx -N $FSX_OPS -S $SEED $FSX_ARGS and fsstress -n $FSS_OPS -p $FSS_PROCS -s $SEED (cap ${TIME_LIMIT}s)"
t0=$(date +%s.%N)
# shellcheck disable=SC2086 # FSX_ARGS is a list of options
timeout "$TIME_LIMIT" "$FSX" $FSX_ARGS -N "$FSX_OPS" -S "$SEED" -P "$WORK/fsxlogs" \
  "$WORK/mnt/fsx.file" >"$OUT/fsx.out" 2>&1 &
fsx_pid=$!
timeout "$TIME_LIMIT" "$FSSTRESS" -d "$WORK/mnt/fsstress" -n "$FSS_OPS" -p "$FSS_PROCS" \
  -s "$SEED" >"$OUT/fsstress.out" 2>&1 &
fss_pid=$!
fsx_rc=0 fss_rc=0
wait "$fsx_pid" || fsx_rc=$?
wait "$fss_pid" || fss_rc=$?
fsx_pid="" fss_pid=""
t1=$(date +%s.%N)
sync
umount "$WORK/mnt"
MOUNTED=0
fsck_rc=0
e2fsck -fn "$LOOP" >"$OUT/e2fsck.out" 2>&1 || fsck_rc=$?
losetup -d "$LOOP"
LOOP=""
fusermount3 -u "$WORK/fuse"
FUSE_UP=0
failed=""
((fsx_rc == 124)) && sq_log "fsx hit the ${TIME_LIMIT}s cap (not a failure; fewer ops than asked)"
((fss_rc == 124)) && sq_log "fsstress hit the ${TIME_LIMIT}s cap (not a failure; fewer ops than asked)"
if ((fsx_rc != 0 && fsx_rc != 124)); then
  failed+=" fsx(exit $fsx_rc)"
  cp -a "$WORK/fsxlogs" "$OUT/" 2>/dev/null || true
fi
((fss_rc != 0 && fss_rc != 124)) && failed+=" fsstress(exit $fss_rc)"
((fsck_rc != 0)) && failed+=" e2fsck(exit $fsck_rc)"

# --- counters ---------------------------------------------------------------------------------
if ((SETTLE > 0)); then
  sq_log "leaving the server idle for ${SETTLE}s"
  sleep "$SETTLE"
fi
"$BIN" stats --json "$WORK/ctl.sock" >"$OUT/stats.json"
sq_serve_stop srv
((SQ_SERVE_RC == 0)) || sq_log "squeeze serve exited with status $SQ_SERVE_RC (see $OUT/serve.log)"
"$BIN" stats --json "$VOL" >"$OUT/reopen.json" 2>"$OUT/reopen.err" \
  || sq_log "reopening the volume failed: $(cat "$OUT/reopen.err")"

python3 - "$OUT" "$LABEL" "$t0" "$t1" "$fsx_rc" "$fss_rc" "${failed:-}" <<'EOF' | sq_emit | sq_table -
import json, sys
out, label, t0, t1, fsx_rc, fss_rc, failed = sys.argv[1:]
def vol(path):
    try:
        d = json.load(open(path))
    except Exception:
        return {}
    return next(iter(d.values())) if d and all(isinstance(v, dict) for v in d.values()) else d
s, r = vol(f"{out}/stats.json"), vol(f"{out}/reopen.json")
gib = lambda b: b / 2**30
client, log, ckpt = s["bytes_written"], s["log_bytes_written"], s["checkpoint_bytes_written"]
res = {
    "label": label, "seconds": round(float(t1) - float(t0), 1),
    "fsx_exit": int(fsx_rc), "fsstress_exit": int(fss_rc), "failed": failed.strip() or None,
    "client_bytes": client, "log_bytes": log, "checkpoint_bytes": ckpt,
    "checkpoints": s["checkpoints"],
    "write_amplification": s["write_amplification"],
    "prewritten_bytes": s.get("prewritten_bytes", 0),
    "device_bytes_per_client_byte": (log + ckpt + s.get("prewritten_bytes", 0)) / client if client else 0.0,
}
for k in ("checkpoint_base_bytes", "checkpoint_delta_bytes", "checkpoint_deltas", "open_seconds",
          "merge_bytes_written", "cleaner_bytes_moved", "compression_ratio", "mapped_bytes",
          "stored_bytes", "physical_bytes", "allocated_bytes", "garbage_bytes",
          "cleaner_over_budget_bytes", "cleaner_idle_bytes", "cleaner_space_bytes"):
    if k in s:
        res[k] = s[k]
if "open_seconds" in r:
    res["reopen_open_seconds"] = r["open_seconds"]
    res["reopen_replayed_records"] = r.get("open_replayed_records")
json.dump(res, open(f"{out}/result.json", "w"), indent=2)
print(json.dumps(res))  # the line of results.jsonl (bench/lib.sh sq_emit)
opt = lambda k, f: f(res[k]) if k in res else "n/a"
print("| binary | seconds | client GiB | log GiB | cleaner GiB | checkpoint GiB | checkpoints | WA (squeeze) | (log+ckpt+prewritten)/client | ckpt base GiB | ckpt delta GiB | deltas | reopen s | cleaner busy / idle / short of room GiB | stored / allocated MiB at the end |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
mib = lambda k: f"{res[k] / 2**20:.0f}" if k in res else "n/a"
why = " / ".join(opt(k, lambda v: f"{gib(v):.2f}") for k in ("cleaner_over_budget_bytes", "cleaner_idle_bytes", "cleaner_space_bytes"))
print(f"| {label} | {res['seconds']} | {gib(client):.2f} | {gib(log):.2f} | {opt('cleaner_bytes_moved', lambda v: f'{gib(v):.2f}')} | {gib(ckpt):.2f} | {res['checkpoints']} "
      f"| {res['write_amplification']:.2f} | {res['device_bytes_per_client_byte']:.2f} "
      f"| {opt('checkpoint_base_bytes', lambda v: f'{gib(v):.3f}')} | {opt('checkpoint_delta_bytes', lambda v: f'{gib(v):.3f}')} "
      f"| {opt('checkpoint_deltas', str)} | {opt('reopen_open_seconds', lambda v: f'{v:.3f}')} "
      f"| {why} | {mib('stored_bytes')} / {mib('allocated_bytes')} |")
EOF

if [[ -n $failed ]]; then
  KEEP=1
  sq_log "FAILED:$failed — fsx logs in $OUT/fsxlogs, fsx.out, fsstress.out, e2fsck.out; volume kept in $WORK"
  exit 1
fi
sq_log "results in $OUT (result.json, stats.json)"
