#!/usr/bin/env bash
# bench/pg_fillfactor.sh — PostgreSQL on a squeeze volume against PostgreSQL on a plain file, at
# fillfactor 100, 90, 80, 70 and 50 (issue 19; the seed's first case study, ../shared/seeds/002_*).
#
#   sudo bench/pg_fillfactor.sh --quick    # smoke: pgbench scale 2, 100k sysbench rows, 5 s runs (~5 min)
#   sudo bench/pg_fillfactor.sh            # full: scale 20, 1M rows, 60 s runs (~30 min)
#   MEM_LIMIT=192M SB_ROWS=3000000 WORKLOADS=sysbench FILLFACTORS="100 90 70" sudo bench/pg_fillfactor.sh
#                                          # data larger than memory (issue 37 item 5, ~30 min)
#   FILLFACTORS="100 70" RUN_SECS=120 sudo bench/pg_fillfactor.sh     # repeat the key runs
#   REPORT_ONLY=results/pg_fillfactor-<time> bench/pg_fillfactor.sh   # the tables again, no measuring
#
# The sides, ext4 (mounted noatime) on a loop device with direct I/O, set up once and used in
# turns (for each fillfactor, each workload: squeeze, then plain), so a burst of load from the
# other users of the machine hits every side alike:
#   squeeze  `squeeze serve --fuse-dir --prewrite` (default policy; --prewrite as docs/DATABASES.md
#            advises for databases): its own FUSE export -> loop -> ext4
#            (SQUEEZE_PATH=nbdfuse: `squeeze serve` -> Unix socket -> nbdfuse (libnbd) -> loop -> ext4,
#            the path of the runs before session 8)
#   plain    a sparse file on the same disk   -> loop -> ext4
#   host     (only if SIDES names it) a directory on the host's own file system (/var/tmp: ext4 on
#            the same disk), no loop device: what PostgreSQL gets without any of this stack
# On each, Debian's PostgreSQL (the newest /usr/lib/postgresql/*/bin) with the same settings:
# fsync, synchronous_commit and full_page_writes on, shared_buffers 256MB, max_wal_size 2GB,
# checkpoint_timeout 5min (the postgresql.conf lines in side_up); data directory and WAL on the
# volume.
#
# Workloads, each on a fresh database per fillfactor:
#   pgbench   `pgbench -i -s PGB_SCALE -F FF`, then the TPC-B-like script: -c CLIENTS -j 2
#             -M prepared -T RUN_SECS (pgbench's filler column is blank: unrealistically compressible)
#   sysbench  oltp_update_non_index on one table of SB_ROWS rows (c CHAR(120), pad CHAR(60) of
#             random digit groups: about 2.5:1 with zstd), loaded by `sysbench prepare`, then
#             ALTER TABLE ... SET (fillfactor=FF) + VACUUM FULL (the table and its indexes rewritten
#             at FF), then --threads=CLIENTS --time=RUN_SECS. Each update rewrites the unindexed c.
# Data larger than memory (MEM_LIMIT set): each side's PostgreSQL server (the postmaster and every
# backend it forks) runs in its own cgroup v1 memory group, /sys/fs/cgroup/memory/squeeze-pg.<pid>.<side>,
# with memory.limit_in_bytes = MEM_LIMIT, made before the server starts and removed after it stops.
# The page cache of the ext4 files is charged to the group of the process that first reads or
# dirties a page, so PostgreSQL's shared_buffers (shared memory, never reclaimed: there is no swap),
# its backends and its page cache all live in MEM_LIMIT; the clients (pgbench, sysbench, psql),
# mkfs and the loop devices (direct I/O: no page cache of the backing file) stay outside.
# shared_buffers defaults to a quarter of MEM_LIMIT (SHARED_BUFFERS over half of it is refused),
# maintenance_work_mem to an eighth (the default 64MB let the kernel kill a backend building an
# index in 64M).
# The squeeze server reads its backing file through the host's page cache, a cache the plain
# side's direct-I/O loop device does not get: with MEM_LIMIT it runs in a group of its own
# (limit SERVE_MEM_LIMIT, default none), so its memory (cache = that page cache) is on record,
# and the loop devices' average read time shows whether its reads came from RAM. Per run (the
# counters reset before it): the group's peak (memory.max_usage_in_bytes), how often it hit the
# limit (memory.failcnt) and memory.stat's cache, rss and shmem at the end, for both groups.
#
# Before each run: CHECKPOINT (the run starts with every page's first change paying a full-page
# image, as after any checkpoint), pg_stat_reset and pg_stat_reset_shared('wal').
#
# Reported per (workload, fillfactor, side), from results.jsonl by bench/pg_fillfactor.py:
#   TPS, latency avg/p50/p95/p99 (pgbench's per-transaction log; sysbench's histogram),
#   HOT updates (% of updates, pg_stat_user_tables), WAL bytes and full-page images per
#   transaction (pg_stat_wal), reads per transaction (the loop device's read_ios: reads that
#   missed ext4's page cache; PostgreSQL's blks_read in pg_stat_database: reads that missed
#   shared_buffers), logical sizes after the run (pg_relation_size of the main table,
#   pg_total_relation_size, pg_database_size), the physical bytes of the database, and the loop
#   device's view (writes, average write size, flushes and average flush time: /sys/block/loopN/stat).
# Physical bytes of the database: CHECKPOINT, sync and fstrim after the run, measure; DROP
# DATABASE, CHECKPOINT, sync, fstrim, measure again; the difference. Measured as squeeze's
# stored_bytes (live compressed records, `squeeze stats --json` on the server's control socket)
# and as the plain file's allocated bytes (du; host: du of the data directory). WAL and the rest of the cluster are outside the
# difference. At the end of each side: the whole volume (squeeze: physical_bytes as du counts
# the backing file after up to SETTLE_SECS of idle cleaning, garbage, ratio; plain: du).
#
# Output: OUT/results.jsonl (one line per run), OUT/table.md (the tables, also on stdout),
# OUT/machine.txt, and per run OUT/WORKLOAD-ffFF-SIDE/ (bench/pg_fillfactor.py reads them).
#
# Env: OUT (results/pg_fillfactor-<time>; OUT_BASE is read as OUT), SCRATCH (/var/tmp/squeeze-pg.<pid>: on the disk
#      both sides share), FILLFACTORS ("100 90 80 70 50"), WORKLOADS ("pgbench sysbench"),
#      SIDES ("squeeze plain"), PGB_SCALE (20; quick 2), SB_ROWS (1000000; quick 100000),
#      RUN_SECS (60; quick 5), CLIENTS (8), VOL_SIZE (16G), SHARED_BUFFERS (256MB; with
#      MEM_LIMIT a quarter of it), MAINTENANCE_WORK_MEM (64MB; with MEM_LIMIT an eighth of it),
#      MEM_LIMIT (unset: no memory group; e.g. 192M, as memory.limit_in_bytes takes it),
#      SERVE_MEM_LIMIT (unset: the squeeze server's group has no limit; only with MEM_LIMIT),
#      SQUEEZE_SERVE_ARGS (extra `serve` options; default --prewrite, set it empty for none), SQUEEZE_PATH (fuse; nbdfuse), NBDFUSE_ARGS
#      (extra nbdfuse options),
#      PG_EXTRA_CONF (lines appended to postgresql.conf on every side, e.g.
#      "full_page_writes = off" to measure what full-page images cost: not a safe setting, see
#      docs/DATABASES.md), PG_INITDB_ARGS (e.g. --data-checksums),
#      TRACE (0; 1: the server logs every NBD request, and bench/pg_fillfactor.py write-sizes
#      summarises the WRITE lengths, and, from each file's extents (filefrag) and the trace of
#      the run and the CHECKPOINT after it, whether every 8 KiB page of a relation file reached
#      squeeze whole in one WRITE and inside one blob: slow, for the probe, not for timing),
#      SB_RAND_TYPE (sysbench's --rand-type; unset: its default, "special", which sends 75% of the
#      updates to 1% of the rows: a hot set that fits in memory; "uniform" for data larger than it),
#      UPGRADE_WAIT_SECS (0: squeeze's bytes are read at once; N: first up to N s for the records
#      the adaptive codec or the burst floor wrote below the target codec to be upgraded, so a
#      busy machine's raw backlog is not counted as the database's bytes; each wait's seconds and
#      what was still below the target, raw, upgraded and merged go to OUT/upgrade_wait.txt),
#      SETTLE_SECS (60), BENCH_LOCK (/tmp/bench.lock), INSTALL (1), CARGO_TARGET_DIR, BIN (a squeeze
#      binary to use instead of building one).
# The whole run holds the bench lock (bench/README.md). Needs root (loop devices, mounts, FUSE).
set -euo pipefail

SQ_PROG=bench/pg_fillfactor.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PY=$SQ_ROOT/bench/pg_fillfactor.py

QUICK=0
for a in "$@"; do
  case $a in
    --quick) QUICK=1 ;;
    --full) QUICK=0 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) sq_die "unknown argument '$a' (--quick, --full, --help)" ;;
  esac
done

if [[ -n ${REPORT_ONLY:-} ]]; then
  python3 "$PY" table "$REPORT_ONLY"
  exit 0
fi

if ((QUICK)); then
  PGB_SCALE=${PGB_SCALE:-2} SB_ROWS=${SB_ROWS:-100000} RUN_SECS=${RUN_SECS:-5}
  SETTLE_SECS=${SETTLE_SECS:-10}
else
  PGB_SCALE=${PGB_SCALE:-20} SB_ROWS=${SB_ROWS:-1000000} RUN_SECS=${RUN_SECS:-60}
  SETTLE_SECS=${SETTLE_SECS:-60}
fi
FILLFACTORS=${FILLFACTORS:-100 90 80 70 50}
WORKLOADS=${WORKLOADS:-pgbench sysbench}
SIDES=${SIDES:-squeeze plain}
CLIENTS=${CLIENTS:-8}
VOL_SIZE=${VOL_SIZE:-16G}
SQUEEZE_SERVE_ARGS=${SQUEEZE_SERVE_ARGS---prewrite}
MEM_LIMIT=${MEM_LIMIT:-}
SERVE_MEM_LIMIT=${SERVE_MEM_LIMIT:-}
if [[ -n $MEM_LIMIT ]]; then
  mem_limit_bytes=$(numfmt --from=iec "$MEM_LIMIT" 2>/dev/null) \
    || sq_die "MEM_LIMIT=$MEM_LIMIT: not a size (e.g. 192M, 1G)"
  SHARED_BUFFERS=${SHARED_BUFFERS:-$((mem_limit_bytes / 4 >> 20))MB}
  # PostgreSQL's units (kB, MB, GB) as numfmt reads them
  sb_bytes=$(sed 's/B$//; s/k$/K/' <<<"$SHARED_BUFFERS" | numfmt --from=iec 2>/dev/null) \
    || sq_die "SHARED_BUFFERS=$SHARED_BUFFERS: not a size numfmt reads (e.g. 48MB)"
  ((sb_bytes * 2 <= mem_limit_bytes)) \
    || sq_die "SHARED_BUFFERS=$SHARED_BUFFERS is over half of MEM_LIMIT=$MEM_LIMIT: shared memory is never reclaimed, the backends and the page cache need the rest"
elif [[ -n $SERVE_MEM_LIMIT ]]; then
  sq_die "SERVE_MEM_LIMIT needs MEM_LIMIT"
fi
SHARED_BUFFERS=${SHARED_BUFFERS:-256MB}
# Index builds (CREATE INDEX, VACUUM FULL) and (auto)vacuum take up to maintenance_work_mem each
# (PostgreSQL's default 64MB): in a memory group it must leave room, or the kernel kills a backend.
MAINTENANCE_WORK_MEM=${MAINTENANCE_WORK_MEM:-$([[ -n $MEM_LIMIT ]] && echo "$((mem_limit_bytes / 8 >> 20))MB" || echo 64MB)}
TRACE=${TRACE:-0}
UPGRADE_WAIT_SECS=${UPGRADE_WAIT_SECS:-0}
OUT=${OUT:-${OUT_BASE:-}}
SCRATCH=${SCRATCH:-/var/tmp/squeeze-pg.$$}

[[ $(id -u) == 0 ]] || sq_die "run as root (loop devices, mounts, FUSE)"

# command:package pairs
PG_TOOLS="pgbench:postgresql psql:postgresql sysbench:sysbench nbdfuse:libnbd-bin
  fusermount3:fuse3 mkfs.ext4:e2fsprogs fstrim:util-linux losetup:mount runuser:util-linux
  flock:util-linux python3:python3"
need_tools() {
  local t pkgs=()
  for t in $PG_TOOLS; do
    command -v "${t%%:*}" >/dev/null 2>&1 || pkgs+=("${t##*:}")
  done
  ((${#pkgs[@]})) || return 0
  mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
  if [[ ${INSTALL:-1} != 0 ]] && command -v apt-get >/dev/null; then
    sq_log "installing ${pkgs[*]} (apt-get; INSTALL=0 to refuse)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >&2 \
      || sq_die "apt-get install failed; run: apt-get install -y ${pkgs[*]}"
  else
    sq_die "missing tools; run: apt-get update && apt-get install -y ${pkgs[*]}"
  fi
}

CG_ROOT=/sys/fs/cgroup/memory
if [[ -n $MEM_LIMIT ]]; then
  [[ -f $CG_ROOT/memory.limit_in_bytes && -w $CG_ROOT ]] \
    || sq_die "MEM_LIMIT needs the cgroup v1 memory controller mounted writable at $CG_ROOT (cgroup v2 is not supported here)"
fi

need_tools
sq_lock
sq_bin

PG_BIN=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d | sort -V | tail -n1)
[[ -x $PG_BIN/postgres ]] || sq_die "no PostgreSQL server under /usr/lib/postgresql (apt-get install postgresql)"
id postgres >/dev/null 2>&1 || sq_die "no postgres user (apt-get install postgresql creates it)"

mkdir -p "$SCRATCH"
sq_out pg_fillfactor "$SCRATCH"
{
  echo "postgresql: $("$PG_BIN/postgres" --version)"
  echo "sysbench: $(sysbench --version)"
  echo "nbdfuse: $(nbdfuse --version | head -n1)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "settings: mode=$([[ $QUICK == 1 ]] && echo quick || echo full) pgbench_scale=$PGB_SCALE sysbench_rows=$SB_ROWS run_secs=$RUN_SECS clients=$CLIENTS shared_buffers=$SHARED_BUFFERS maintenance_work_mem=$MAINTENANCE_WORK_MEM mem_limit=${MEM_LIMIT:-none} serve_mem_limit=${SERVE_MEM_LIMIT:-none} sb_rand_type=${SB_RAND_TYPE:-default} upgrade_wait_secs=$UPGRADE_WAIT_SECS vol_size=$VOL_SIZE fillfactors=\"$FILLFACTORS\" serve_args=\"${SQUEEZE_SERVE_ARGS:-}\" pg_extra_conf=\"${PG_EXTRA_CONF:-}\" initdb_args=\"${PG_INITDB_ARGS:-}\""
} >>"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

# ---------------------------------------------------------------- sides: bring up, tear down
declare -A DIR LOOP PORT
port=55432
for s in $SIDES; do
  DIR[$s]=$SCRATCH/$s PORT[$s]=$port
  port=$((port + 1))
done

pg() { # pg SIDE ARGS...: psql as postgres on SIDE's cluster
  local s=$1
  shift
  PGOPTIONS="-c client_min_messages=warning" \
    psql -h "${DIR[$s]}/run" -p "${PORT[$s]}" -U postgres -X -q -At -v ON_ERROR_STOP=1 "$@"
}

# ---------------------------------------------------------------- memory groups (MEM_LIMIT)
declare -A CG # CG[SIDE] the PostgreSQL server's group, CG[SIDE.serve] the squeeze server's
cg_make() { # cg_make KEY LIMIT: a memory group of our own (LIMIT empty: none)
  local g=$CG_ROOT/squeeze-pg.$$.${1/./-}
  mkdir "$g" || sq_die "cannot make the memory group $g"
  CG[$1]=$g
  if [[ -n $2 ]]; then
    echo "$2" >"$g/memory.limit_in_bytes" || sq_die "cannot set $g/memory.limit_in_bytes to $2"
  fi
  sq_log "memory group $g, limit $(numfmt --to=iec "$(cat "$g/memory.limit_in_bytes")")"
}

cg_remove() { # cg_remove KEY: once its processes have gone (its page cache is dropped with it)
  local g=${CG[$1]:-} i
  [[ -n $g && -d $g ]] || return 0
  for ((i = 0; i < 50; i++)); do [[ -s $g/cgroup.procs ]] || break; sleep 0.1; done
  echo 0 >"$g/memory.force_empty" 2>/dev/null || true
  rmdir "$g" || sq_log "could not remove the memory group $g (processes left: $(tr '\n' ' ' <"$g/cgroup.procs"))"
  CG[$1]=""
}

cg_reset() { # the peak and the count of hits against the limit start again
  local g=${CG[$1]:-}
  [[ -n $g ]] || return 0
  echo 0 >"$g/memory.max_usage_in_bytes"
  echo 0 >"$g/memory.failcnt"
}

cg_stat() { # cg_stat KEY: the group's figures as "key value" lines (nothing without a group)
  local g=${CG[$1]:-}
  [[ -n $g ]] || return 0
  echo "limit_bytes $(cat "$g/memory.limit_in_bytes")"
  echo "usage_bytes $(cat "$g/memory.usage_in_bytes")"
  echo "max_usage_bytes $(cat "$g/memory.max_usage_in_bytes")"
  echo "failcnt $(cat "$g/memory.failcnt")"
  grep -E '^(cache|rss|shmem|mapped_file|dirty|writeback|pgmajfault|total_pgpgin) ' "$g/memory.stat"
}

pg_start() { # the side's postmaster, in its memory group if there is one
  local s=$1 d=${DIR[$1]}
  (
    [[ -z ${CG[$s]:-} ]] || echo "$BASHPID" >"${CG[$s]}/cgroup.procs" || exit 1
    exec runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$d/mnt/pgdata" -l "$OUT/postgres-$s.log" -w start >/dev/null
  ) || sq_die "$s: PostgreSQL did not start (see $OUT/postgres-$s.log)"
}

side_down() {
  local s=$1 d=${DIR[$1]}
  if [[ -f $d/mnt/pgdata/postmaster.pid ]]; then
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$d/mnt/pgdata" -m fast -w stop >/dev/null 2>&1 || true
  fi
  cg_remove "$s"
  if mountpoint -q "$d/mnt" 2>/dev/null; then umount "$d/mnt" || umount -l "$d/mnt"; fi
  if [[ -n ${LOOP[$s]:-} ]]; then losetup -d "${LOOP[$s]}" || true; LOOP[$s]=""; fi
  # nbdfuse's mount goes now; the server's own export goes with the server (SIGTERM).
  if [[ ${SQUEEZE_PATH:-fuse} != fuse ]] && mountpoint -q "$d/fuse" 2>/dev/null; then
    fusermount3 -u "$d/fuse" || umount -l "$d/fuse"
  fi
  [[ $s != squeeze ]] || { sq_serve_stop squeeze; cg_remove "$s.serve"; }
}

cleanup() {
  local s
  for s in $SIDES; do side_down "$s"; done
  # never descend into a mount that would not go away
  findmnt -rn -o TARGET | grep -q "^$SCRATCH/" || rm -rf "$SCRATCH"
}
sq_on_exit cleanup

wait_for() { # wait_for SECONDS TEST...
  local t=$1 i
  shift
  for ((i = 0; i < t * 10; i++)); do "$@" && return 0; sleep 0.1; done
  return 1
}

side_up() {
  local s=$1 d=${DIR[$1]} dev
  mkdir -p "$d/mnt" "$d/run"
  case $s in
    squeeze)
      mkdir -p "$d/fuse"
      local fuse_args=()
      [[ ${SQUEEZE_PATH:-fuse} == fuse ]] && fuse_args=(--fuse-dir "$d/fuse")
      local ready=(--ready "$d/ctl")
      [[ ${SQUEEZE_PATH:-fuse} != fuse ]] || ready+=(--ready "$d/fuse/vol")
      # shellcheck disable=SC2086
      if ((TRACE)); then
        RUST_LOG=squeeze_nbd::server::transmission=trace sq_serve_start squeeze "$OUT/serve-trace.log" \
          "${ready[@]}" -- --socket "$d/nbd.sock" --control "$d/ctl" --size "$VOL_SIZE" "${fuse_args[@]}" \
          ${SQUEEZE_SERVE_ARGS:-} "$d/vol.sqz"
      else
        sq_serve_start squeeze "$OUT/serve.log" "${ready[@]}" -- --socket "$d/nbd.sock" --control "$d/ctl" \
          --size "$VOL_SIZE" "${fuse_args[@]}" ${SQUEEZE_SERVE_ARGS:-} "$d/vol.sqz"
      fi
      if [[ -n $MEM_LIMIT ]]; then # before it reads anything: its page cache is charged there
        cg_make "$s.serve" "$SERVE_MEM_LIMIT"
        sq_serve_pid squeeze >"${CG[$s.serve]}/cgroup.procs" \
          || sq_die "cannot move the squeeze server into ${CG[$s.serve]}"
      fi
      if [[ ${SQUEEZE_PATH:-fuse} == fuse ]]; then
        dev=$d/fuse/vol
      else
        # shellcheck disable=SC2086
        nbdfuse -P "$d/nbdfuse.pid" ${NBDFUSE_ARGS:-} "$d/fuse" "nbd+unix:///vol?socket=$d/nbd.sock" \
          2>"$OUT/nbdfuse.log" &
        wait_for 30 test -s "$d/nbdfuse.pid" || sq_die "nbdfuse did not start (see $OUT/nbdfuse.log)"
        dev=$d/fuse/nbd
      fi
      ;;
    plain)
      truncate -s "$VOL_SIZE" "$d/plain.img"
      dev=$d/plain.img
      ;;
    host) dev="" ;;
    *) sq_die "unknown side $s (squeeze, plain, host)" ;;
  esac
  if [[ -n $dev ]]; then
    LOOP[$s]=$(losetup -f --show --direct-io=on "$dev")
    # Lazy inode tables and journal (the device reads zeros after mkfs's discard), and no
    # background zeroing thread during the runs: both sides write only what PostgreSQL causes.
    mkfs.ext4 -q -E discard,lazy_itable_init=1,lazy_journal_init=1 "${LOOP[$s]}"
    mount -o noatime,noinit_itable "${LOOP[$s]}" "$d/mnt"
  fi
  mkdir -p "$d/mnt/pgdata"
  chown postgres: "$d/mnt/pgdata" "$d/run"
  # shellcheck disable=SC2086 # PG_INITDB_ARGS is a list of options
  runuser -u postgres -- "$PG_BIN/initdb" -D "$d/mnt/pgdata" --auth=trust -U postgres \
    ${PG_INITDB_ARGS:-} >"$OUT/initdb-$s.log"
  cat >>"$d/mnt/pgdata/postgresql.conf" <<EOF
# bench/pg_fillfactor.sh: the same on both sides
listen_addresses = ''
unix_socket_directories = '$d/run'
port = ${PORT[$s]}
max_connections = 100
shared_buffers = $SHARED_BUFFERS
maintenance_work_mem = $MAINTENANCE_WORK_MEM
fsync = on
synchronous_commit = on
full_page_writes = on
wal_sync_method = fdatasync
max_wal_size = 2GB
min_wal_size = 80MB
checkpoint_timeout = 5min
checkpoint_completion_target = 0.9
random_page_cost = 1.1
effective_io_concurrency = 200
autovacuum = on
log_checkpoints = on
${PG_EXTRA_CONF:-}
EOF
  install -o postgres -m 644 /dev/null "$OUT/postgres-$s.log"
  [[ -z $MEM_LIMIT ]] || cg_make "$s" "$MEM_LIMIT"
  pg_start "$s"
  if [[ -n ${LOOP[$s]:-} ]]; then
    sq_log "$s: ${LOOP[$s]} ($(losetup -nl -O DIO "${LOOP[$s]}" | tr -d ' ') direct I/O) ext4 at $d/mnt, PostgreSQL on port ${PORT[$s]}"
  else
    sq_log "$s: the host's file system at $d/mnt, PostgreSQL on port ${PORT[$s]}"
  fi
}

# ---------------------------------------------------------------- measurements
settle_fs() { # CHECKPOINT, push the page cache, give freed blocks back to the device
  local s=$1
  pg "$s" -c "CHECKPOINT" >/dev/null
  sync -f "${DIR[$s]}/mnt"
  if mountpoint -q "${DIR[$s]}/mnt"; then fstrim "${DIR[$s]}/mnt"; fi
}

vol_stats() { # the volume's live statistics (the control socket answers {"vol": {...}})
  "$BIN" stats --json "${DIR[squeeze]}/ctl" \
    | python3 -c 'import json,sys; print(json.dumps(next(iter(json.load(sys.stdin).values())), indent=1))'
}

upgrade_wait() { # up to UPGRADE_WAIT_SECS for the records written below the target codec to be upgraded
  local i left
  for ((i = 0; i < UPGRADE_WAIT_SECS; i++)); do
    vol_stats | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["below_target_pending_bytes"] == 0 else 1)' \
      && break
    sleep 1
  done
  # What was still below the target (and of it, raw from the burst floor) when the wait ended.
  left=$(vol_stats | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["below_target_pending_bytes"], s["burst_raw_pending_bytes"], s["upgraded_bytes"], s["merged_bytes"])')
  read -r pend raw up merged <<<"$left"
  echo "upgrade wait: ${i} s; below target ${pend} bytes (raw ${raw}); upgraded ${up}, merged ${merged} bytes so far" >&2
  echo "${i} ${pend} ${raw} ${up} ${merged}" >>"$OUT/upgrade_wait.txt"
}

phys_bytes() { # the side's bytes for the database difference
  case $1 in
    squeeze)
      upgrade_wait
      vol_stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["stored_bytes"])'
      ;;
    plain) du -B1 "${DIR[plain]}/plain.img" | cut -f1 ;;
    host) du -s -B1 "${DIR[host]}/mnt/pgdata" | cut -f1 ;;
  esac
}

loop_stat() { [[ -z ${LOOP[$1]:-} ]] || cat "/sys/block/${LOOP[$1]#/dev/}/stat"; }

cpu_ticks() { # utime+stime of a pid (0 if none)
  local p=${1:-}
  [[ -n $p && -r /proc/$p/stat ]] || { echo 0; return; }
  awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat"
}

helper_pids() { # pids whose CPU counts as the side's storage stack
  [[ $1 == squeeze ]] || return 0
  echo "$(sq_serve_pid squeeze)" "$(cat "${DIR[squeeze]}/nbdfuse.pid" 2>/dev/null)"
}

stack_ticks() {
  local t=0 p
  for p in $(helper_pids "$1"); do t=$((t + $(cpu_ticks "$p"))); done
  echo $t
}

fsync_probe() { # pg_test_fsync on the volume: what one WAL commit costs there
  local s=$1
  sq_log "$s: pg_test_fsync"
  runuser -u postgres -- "$PG_BIN/pg_test_fsync" -s "$([[ $QUICK == 1 ]] && echo 1 || echo 3)" \
    -f "${DIR[$s]}/mnt/pgdata/fsync_probe" >"$OUT/pg_test_fsync-$s.txt" 2>&1 || true
  rm -f "${DIR[$s]}/mnt/pgdata/fsync_probe"
}

load() { # load SIDE WORKLOAD FF
  local s=$1 w=$2 ff=$3 h=${DIR[$1]}/run p=${PORT[$1]}
  case $w in
    pgbench)
      pgbench -h "$h" -p "$p" -U postgres -i -q -s "$PGB_SCALE" -F "$ff" bench 2>&1
      ;;
    sysbench)
      sysbench oltp_update_non_index --db-driver=pgsql --pgsql-host="$h" --pgsql-port="$p" \
        --pgsql-user=postgres --pgsql-db=bench --tables=1 --table-size="$SB_ROWS" prepare
      pg "$s" -d bench -c "ALTER TABLE sbtest1 SET (fillfactor = $ff)" -c "VACUUM FULL sbtest1" \
        -c "VACUUM ANALYZE sbtest1"
      ;;
  esac
}

run() { # run SIDE WORKLOAD OUTDIR: the timed part
  local s=$1 w=$2 o=$3 h=${DIR[$1]}/run p=${PORT[$1]}
  case $w in
    pgbench)
      (cd "$o" && pgbench -h "$h" -p "$p" -U postgres -c "$CLIENTS" -j 2 -M prepared \
        -T "$RUN_SECS" -l --log-prefix=txlog bench >run.out 2>run.err)
      ;;
    sysbench)
      sysbench oltp_update_non_index --db-driver=pgsql --pgsql-host="$h" --pgsql-port="$p" \
        --pgsql-user=postgres --pgsql-db=bench --tables=1 --table-size="$SB_ROWS" \
        --threads="$CLIENTS" --time="$RUN_SECS" --histogram=on --report-interval=0 \
        ${SB_RAND_TYPE:+--rand-type="$SB_RAND_TYPE"} \
        run >"$o/run.out" 2>"$o/run.err"
      ;;
  esac
}

extents() { # where every file of the cluster lies on the device (filefrag, in file system blocks)
  local f
  find "${DIR[$1]}/mnt/pgdata" -type f -size +0 | while read -r f; do
    echo "FILE ${f#"${DIR[$1]}"/mnt/pgdata/}"
    filefrag -e "$f" | tail -n +2
  done
}

main_table() { case $1 in pgbench) echo pgbench_accounts ;; sysbench) echo sbtest1 ;; esac; }

sizes() { # logical sizes and update counters as "key value" lines
  local s=$1 t
  t=$(main_table "$2")
  pg "$s" -d bench -F ' ' -c "SELECT 'table_bytes', pg_relation_size('$t')
    UNION ALL SELECT 'table_total_bytes', pg_total_relation_size('$t')
    UNION ALL SELECT 'all_tables_total_bytes', sum(pg_total_relation_size(relid))::bigint FROM pg_stat_user_tables
    UNION ALL SELECT 'database_bytes', pg_database_size('bench')"
}

one() { # one SIDE WORKLOAD FF
  local s=$1 w=$2 ff=$3 o t0 t1 tb=$OUT/$2-ff$3-$1 before after lb la cb ca
  o=$tb
  mkdir -p "$o"
  sq_log "$s $w ff=$ff: load"
  pg "$s" -c "DROP DATABASE IF EXISTS bench" -c "CREATE DATABASE bench"
  t0=$(date +%s.%N)
  load "$s" "$w" "$ff" >"$o/load.log" 2>&1 || sq_die "$s $w ff=$ff: load failed (see $o/load.log)"
  t1=$(date +%s.%N)
  settle_fs "$s"
  sizes "$s" "$w" >"$o/sizes-loaded.txt"
  pg "$s" -d bench -c "SELECT pg_stat_reset()" -c "SELECT pg_stat_reset_shared('wal')" >/dev/null
  pg "$s" -c "CHECKPOINT"
  lb=$(loop_stat "$s")
  cb=$(stack_ticks "$s")
  [[ $s == squeeze ]] && vol_stats >"$o/vol-before.json"
  cg_reset "$s"
  cg_reset "$s.serve"
  sq_log "$s $w ff=$ff: run ${RUN_SECS}s, $CLIENTS clients (load average $(cut -d' ' -f1 /proc/loadavg))"
  ((TRACE)) && echo "from $(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)" >"$o/trace-window.txt"
  run "$s" "$w" "$o" || sq_die "$s $w ff=$ff: run failed (see $o/run.err)"
  la=$(loop_stat "$s")
  ca=$(stack_ticks "$s")
  [[ $s == squeeze ]] && vol_stats >"$o/vol-after.json"
  cg_stat "$s" >"$o/memory-pg.txt"
  cg_stat "$s.serve" >"$o/memory-serve.txt"
  sleep 1 # backends report their table counters when they exit
  pg "$s" -d bench -F ' ' -c "SELECT 'n_tup_upd', n_tup_upd, 'n_tup_hot_upd', n_tup_hot_upd
    FROM pg_stat_user_tables WHERE relname = '$(main_table "$w")'" | awk '{ print $1, $2; print $3, $4 }' >"$o/upd.txt"
  pg "$s" -F ' ' -c "SELECT 'wal_records', wal_records, 'wal_fpi', wal_fpi, 'wal_bytes', wal_bytes FROM pg_stat_wal" \
    | awk '{ print $1, $2; print $3, $4; print $5, $6 }' >"$o/wal.txt"
  pg "$s" -F ' ' -c "SELECT 'blks_read', blks_read, 'blks_hit', blks_hit FROM pg_stat_database
    WHERE datname = 'bench'" | awk '{ print $1, $2; print $3, $4 }' >"$o/blks.txt"
  settle_fs "$s"
  if ((TRACE)) && [[ $s == squeeze ]]; then # the run and the checkpoint after it
    echo "to $(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)" >>"$o/trace-window.txt"
    extents "$s" >"$o/extents.txt"
  fi
  sizes "$s" "$w" >"$o/sizes-run.txt"
  before=$(phys_bytes "$s")
  pg "$s" -c "DROP DATABASE bench"
  settle_fs "$s"
  after=$(phys_bytes "$s")
  {
    echo "side $s"
    echo "workload $w"
    echo "fillfactor $ff"
    echo "load_seconds $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')"
    echo "db_phys_bytes $((before - after))"
    echo "phys_with_db $before"
    echo "phys_without_db $after"
    echo "loop_before $lb"
    echo "loop_after $la"
    echo "stack_cpu_ticks $((ca - cb))"
    echo "clk_tck $(getconf CLK_TCK)"
    echo "load_average $(cut -d' ' -f1-3 /proc/loadavg)"
  } >"$o/meta.txt"
  python3 "$PY" record "$o" | sq_result -
  python3 "$PY" row "$o" >&2
}

volume_summary() {
  local s=$1 i
  case $s in
    squeeze)
      # The server cleans and merges once clients have been idle for a second.
      for ((i = 0; i < SETTLE_SECS; i += 5)); do
        vol_stats >"$OUT/volume-squeeze.json"
        python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s["garbage_bytes"] < 32 << 20 else 1)' \
          "$OUT/volume-squeeze.json" && break
        sleep 5
      done
      vol_stats >"$OUT/volume-squeeze.json"
      ;;
    plain | host)
      echo "{\"physical_bytes\": $(phys_bytes "$s")}" >"$OUT/volume-$s.json"
      ;;
  esac
  # ext4 and PostgreSQL's view of the same volume
  df -B1 --output=used "${DIR[$s]}/mnt" | tail -n1 >"$OUT/df-used-$s.txt"
}

# ---------------------------------------------------------------- the runs
for s in $SIDES; do side_up "$s"; done
for s in $SIDES; do fsync_probe "$s"; done
for ff in $FILLFACTORS; do
  for w in $WORKLOADS; do
    for s in $SIDES; do one "$s" "$w" "$ff"; done
  done
done
for s in $SIDES; do volume_summary "$s"; done
if ((TRACE)); then
  python3 "$PY" write-sizes "$OUT/serve-trace.log" "$OUT"/*-squeeze >"$OUT/write-sizes.txt"
  cat "$OUT/write-sizes.txt" >&2
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.txt"
python3 "$PY" table "$OUT" | sq_table -
sq_log "results under $OUT"
