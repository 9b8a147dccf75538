#!/usr/bin/env bash
# bench/ceph_compare.sh — the ScaleFlux seed's comparison in one command (issue 18): Ceph with
# BlueStore's own compression on plain devices, against Ceph with compression off on OSDs whose
# device is a squeeze volume.
#
#   sudo bench/ceph_compare.sh                          # CONFIGS="plain:none plain:snappy plain:zstd squeeze:none"
#   sudo CONFIGS="squeeze:none" FIO_SIZE=1g bench/ceph_compare.sh
#   sudo REPS=3 bench/ceph_compare.sh                   # every configuration 3 times, in turn
#
# For each configuration, a fresh single-host cluster on loopback (Debian's ceph-mon, ceph-mgr,
# ceph-osd; auth none; pool size 1; one BlueStore OSD, like the seed's per-drive view):
#   plain:ALG    the OSD's block device is a loop device on a sparse file; the pool's BlueStore
#                compression is ALG (none, snappy, zstd, lz4) in mode aggressive;
#   squeeze:ALG  the OSD's block device is a loop device on `squeeze serve --fuse-dir` (the
#                server's own FUSE export, docs/CEPH.md), squeeze's default policy (zstd:3); the
#                pool's BlueStore compression is ALG (none: what docs/CEPH.md recommends).
# Loop devices use direct I/O; discard is on in BlueStore (bdev_enable_discard/async) as
# docs/CEPH.md recommends. Then, on an RBD image, the seed's fio job (ioengine=rbd, bs=128k,
# iodepth=128, buffer_compress_percentage=60, refilled buffers): a sequential write of FIO_SIZE
# and its sequential read; a real-data import (`rbd import` of REAL_MB of files from /usr as one
# tar stream, like the W3 workload); then RANDWRITE_SECONDS of 4 KiB random writes (QD32) on a
# second image.
#
# Reported per configuration: client MB/s of each job, the device's MB/s while the sequential
# write ran (bytes it took on the host disk per second), 4 KiB IOPS; space: the device's bytes on
# the host disk (`du` of the sparse file, or squeeze's physical bytes) before and after each data
# set, and so the ratio = bytes the client wrote / device bytes they took (BlueStore metadata
# included on both sides; for squeeze also after the idle upgrade of what a burst wrote with a
# faster codec, waiting up to IDLE_MAX seconds, shown as "at once / after idle"); CPU seconds
# per GiB the client wrote, of the ceph-osd process, of the squeeze server, and of the whole
# machine (/proc/stat), while the writes ran (the server's CPU in the idle time after them is in
# results.jsonl, idle_server_ticks).
#
# Output: a markdown table on stdout and in OUT/table.md, OUT/results.jsonl (a line per
# configuration and repetition), OUT/machine.txt, and per configuration the fio JSON, Ceph's logs
# and the server's log under OUT/CONFIG/ (OUT/CONFIG.rN/ with REPS > 1). The cluster's files and
# the devices' backing files are in a scratch directory under SCRATCH_BASE, removed at exit.
# With REPS > 1 the configurations run in turn REPS times (one row each, so a slow minute of the
# host falls on every configuration alike), and a second table gives each configuration's median
# write MB/s and the median of its write over the first configuration's write in the same
# repetition.
# Env: CONFIGS, REPS (1), FIO_SIZE (2g), RANDWRITE_SECONDS (30), REAL_MB (512), DEV_SIZE (32G: the
#      device, thin on both sides), OUT (results/ceph_compare-<time>), SCRATCH_BASE (/var/tmp),
#      BENCH_LOCK (/tmp/bench.lock), BIN (a squeeze binary instead of building one),
#      SQUEEZE_SERVE_ARGS, IDLE_MAX (120).
# The whole run holds the bench lock (bench/README.md). Needs root (loop devices, FUSE), fio
# with its rbd engine, and Ceph: as root, `apt-get install ceph-mon ceph-mgr ceph-osd ceph-common
# fio` when missing (INSTALL=0 refuses).
set -euo pipefail

SQ_PROG=bench/ceph_compare.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CONFIGS=${CONFIGS:-plain:none plain:snappy plain:zstd squeeze:none}
REPS=${REPS:-1}
[[ $REPS =~ ^[1-9][0-9]*$ ]] || sq_die "REPS must be a positive integer, not '$REPS'"
FIO_SIZE=${FIO_SIZE:-2g}
RANDWRITE_SECONDS=${RANDWRITE_SECONDS:-30}
REAL_MB=${REAL_MB:-512}
DEV_SIZE=${DEV_SIZE:-32G}
IDLE_MAX=${IDLE_MAX:-120}

[[ $(id -u) == 0 ]] || sq_die "run as root (loop devices, FUSE mounts, Ceph daemons)"
# shellcheck source=bench/ceph_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/ceph_lib.sh"
ceph_need
sq_lock
sq_bin
SCR=$(mktemp -d "${SCRATCH_BASE:-/var/tmp}/squeeze-ceph.XXXXXX")
LOOP=""
SERVER=""
cleanup() {
  ceph_stop
  [[ -z $LOOP ]] || losetup -d "$LOOP" 2>/dev/null || true
  LOOP=""
  sq_serve_stop osd0
  SERVER=""
  mountpoint -q "$SCR/fuse" 2>/dev/null && { fusermount3 -u "$SCR/fuse" 2>/dev/null || umount -l "$SCR/fuse" || true; }
  rm -rf "$SCR"
}
sq_on_exit cleanup
sq_out ceph_compare "$SCR"
echo "ceph: $(ceph --version 2>/dev/null | head -n1)" >>"$OUT/machine.txt"
echo "fio: $(fio --version)" >>"$OUT/machine.txt"

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
machine_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
osd_pid() { ceph_osd_pid 0; }

device_bytes() { # the device's bytes on the host disk
  if [[ $KIND == squeeze ]]; then
    squeeze_stat "$SCR/ctl.sock" physical_bytes
  else
    du -B1 "$SCR/osd0.img" | cut -f1
  fi
}

below_target_pending() { squeeze_stat "$SCR/ctl.sock" below_target_pending_bytes; } # bytes not yet upgraded

device() { # sets LOOP: the OSD's block device
  mkdir -p "$SCR"
  local file
  if [[ $KIND == squeeze ]]; then
    # shellcheck disable=SC2086
    sq_serve_start osd0 "$CDIR/squeeze.log" --ready "$SCR/fuse/osd0" -- \
      --socket "$SCR/nbd.sock" --control "$SCR/ctl.sock" --size "$DEV_SIZE" \
      --fuse-dir "$SCR/fuse" ${SQUEEZE_SERVE_ARGS:-} "$SCR/osd0.sqz"
    SERVER=$(sq_serve_pid osd0)
    file=$SCR/fuse/osd0
  else
    truncate -s "$DEV_SIZE" "$SCR/osd0.img"
    file=$SCR/osd0.img
  fi
  LOOP=$(losetup -f --show --direct-io=on "$file")
  echo 0 >"/sys/block/${LOOP#/dev/}/queue/rotational" 2>/dev/null || true
  mkdir -p "$SCR/dev"
  ln -sfn "$LOOP" "$SCR/dev/osd.0"
}

cluster() { # a mon, a mgr, one OSD on $LOOP, an rbd pool with compression $ALG
  ceph_conf 1 1
  ceph_mon_mgr_up
  ceph_osd_add 0
  ceph_pool rbd 32 "$ALG"
  ceph_wait_clean 120
}

RESULT=()
measure() { # measure NAME GIB_WRITTEN COMMAND...: run it, add "NAME" fields to RESULT
  local name=$1 gib=$2 o0 s0 m0 d0 t0 o1 s1 m1 d1 t1
  shift 2
  o0=$(ticks "$(osd_pid)"); s0=0; [[ -n $SERVER ]] && s0=$(ticks "$SERVER")
  m0=$(machine_ticks); d0=$(device_bytes); t0=$(date +%s.%N)
  "$@"
  t1=$(date +%s.%N); sync; sleep 2
  o1=$(ticks "$(osd_pid)"); s1=0; [[ -n $SERVER ]] && s1=$(ticks "$SERVER")
  m1=$(machine_ticks); d1=$(device_bytes)
  # squeeze writes a burst with a faster codec when the compressor cannot keep up, and upgrades
  # it to the target once the clients are idle (issue 16): the bytes after that idle time too.
  local idle=0 d2=$d1
  if [[ $KIND == squeeze ]] && [[ $gib != 0 ]]; then
    while ((idle < IDLE_MAX)) && (($(below_target_pending) > 0)); do sleep 1; idle=$((idle + 1)); done
    d2=$(device_bytes)
  fi
  local s2=$s1
  [[ -n $SERVER ]] && s2=$(ticks "$SERVER")
  RESULT+=("\"$name\": {\"seconds\": $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'), \"osd_ticks\": $((o1 - o0)),
    \"server_ticks\": $((s1 - s0)), \"machine_ticks\": $((m1 - m0)), \"device_bytes_before\": $d0,
    \"device_bytes_after\": $d1, \"device_bytes_idle\": $d2, \"idle_seconds\": $idle, \"idle_server_ticks\": $((s2 - s1)),
    \"gib\": $gib}")
}

fio_job() { # fio_job NAME IMAGE RW BS QD [extra...]
  local name=$1 image=$2 rw=$3 bs=$4 qd=$5
  shift 5
  fio --name="$name" --ioengine=rbd --clientname=admin --pool=rbd --rbdname="$image" \
    --rw="$rw" --bs="$bs" --iodepth="$qd" --buffer_compress_percentage=60 \
    --buffer_compress_chunk=4k --refill_buffers --randrepeat=1 --output-format=json "$@" \
    >"$CDIR/$name.json" 2>"$CDIR/$name.err" \
    || sq_die "fio $name failed: $(tail -n3 "$CDIR/$name.err")"
}

real_data() { # a tar of REAL_MB of /usr, imported as an RBD image
  # tar dies of SIGPIPE once head has its bytes: that is the plan, not a failure.
  { tar -C / -cf - usr 2>/dev/null || true; } | head -c "$((REAL_MB << 20))" \
    | rbd import - rbd/real >"$CDIR/rbd-import.log" 2>&1 \
    || sq_die "rbd import failed: $(tail -n3 "$CDIR/rbd-import.log")"
}

fio_gib=$(python3 -c "
s='$FIO_SIZE'.lower(); m={'k':2**10,'m':2**20,'g':2**30,'t':2**40}
print((int(s[:-1])*m[s[-1]] if s[-1] in m else int(s)) / 2**30)")
for rep in $(seq "$REPS"); do
for c in $CONFIGS; do
  KIND=${c%%:*}
  ALG=${c#*:}
  [[ $KIND == plain || $KIND == squeeze ]] || sq_die "unknown configuration $c (plain:ALG or squeeze:ALG)"
  CDIR_NAME=${KIND}-$ALG
  ((REPS == 1)) || CDIR_NAME+=.r$rep
  CDIR=$OUT/$CDIR_NAME
  mkdir -p "$CDIR"
  sq_log "$c: cluster up"
  RESULT=()
  device
  cluster
  rbd create --size 16G rbd/seq >/dev/null
  rbd create --size 4G rbd/rand >/dev/null
  sq_log "$c: fio sequential write of $FIO_SIZE, its read"
  measure seqwrite "$fio_gib" fio_job seqwrite seq write 128k 128 --size="$FIO_SIZE"
  measure seqread 0 fio_job seqread seq read 128k 128 --size="$FIO_SIZE"
  sq_log "$c: rbd import of $REAL_MB MiB of /usr"
  measure real "$(python3 -c "print($REAL_MB / 1024)")" real_data
  # Last: its overwrites leave garbage that squeeze's cleaner copies for a while after, which
  # would count in the device bytes of whatever data set came next.
  sq_log "$c: ${RANDWRITE_SECONDS}s of 4 KiB random writes"
  measure randwrite 0 fio_job randwrite rand randwrite 4k 32 --size=4g --time_based --runtime="$RANDWRITE_SECONDS"
  cp "$SCR"/log/*.log "$CDIR/" 2>/dev/null || true
  echo "{\"config\": \"$c\", \"rep\": $rep, \"dir\": \"$CDIR_NAME\", \"hz\": $(getconf CLK_TCK), $(IFS=,; echo "${RESULT[*]}")}" \
    | tr -d '\n' | sq_result -
  cleanup
done
done

python3 - "$OUT" <<'EOF' | sq_table -
import json, sys
out = sys.argv[1]
def fio(cfg, name):
    t = open(f"{out}/{cfg}/{name}.json").read()
    j, _ = json.JSONDecoder().raw_decode(t[t.index("{"):])
    job = j["jobs"][0]
    return job["read"] if job["read"]["io_bytes"] > job["write"]["io_bytes"] else job["write"]
print("| OSD device, pool compression | write MB/s | disk MB/s while writing | read MB/s | 4k randwrite IOPS | ratio, fio data | ratio, real files | ceph-osd CPU s/GiB written | squeeze CPU s/GiB written | whole machine CPU s/GiB written |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
rows = [json.loads(line) for line in open(f"{out}/results.jsonl") if line.strip()]
reps = max(r.get("rep", 1) for r in rows)
for r in rows:
    kind, alg = r["config"].split(":")
    cfg = r.get("dir", f"{kind}-{alg}")
    hz = r["hz"]
    w, rd, rw = fio(cfg, "seqwrite"), fio(cfg, "seqread"), fio(cfg, "randwrite")
    def ratio(k):
        m = r[k]
        def of(after):
            took = m[after] - m["device_bytes_before"]
            return m["gib"] * 2**30 / took if took > 0 else float("nan")
        at_once = f"{of('device_bytes_after'):.2f}"
        if m.get("device_bytes_idle", m["device_bytes_after"]) != m["device_bytes_after"]:
            return f"{at_once} / {of('device_bytes_idle'):.2f} ({m['idle_seconds']} s idle)"
        return at_once
    sw, real = r["seqwrite"], r["real"]
    gib = sw["gib"] + real["gib"]
    per = lambda key: (sw[key] + real[key]) / hz / gib
    label = ("plain file" if kind == "plain" else "squeeze zstd:3 (FUSE export + loop)") + \
            (", BlueStore " + alg if alg != "none" else ", none") + \
            (f", run {r['rep']}" if reps > 1 else "")
    r["write_mbps"] = w["bw_bytes"] / 1e6
    disk = (sw["device_bytes_after"] - sw["device_bytes_before"]) / sw["seconds"] / 1e6
    print(f"| {label} | {w['bw_bytes'] / 1e6:.0f} | {disk:.0f} | {rd['bw_bytes'] / 1e6:.0f} | {rw['iops'] / 1e3:.1f}k "
          f"| {ratio('seqwrite')} | {ratio('real')} | {per('osd_ticks'):.2f} "
          f"| {per('server_ticks'):.2f} | {per('machine_ticks'):.2f} |")
if reps > 1:
    import statistics
    configs = list(dict.fromkeys(r["config"] for r in rows))
    first = configs[0]
    by = {(r["config"], r["rep"]): r["write_mbps"] for r in rows}
    print()
    print(f"| configuration | median write MB/s ({reps} runs) | median write / {first}'s, same run |")
    print("|---|---:|---:|")
    for c in configs:
        mine = [by[(c, k)] for k in range(1, reps + 1) if (c, k) in by]
        rel = [by[(c, k)] / by[(first, k)] for k in range(1, reps + 1) if (c, k) in by and by.get((first, k))]
        print(f"| {c} | {statistics.median(mine):.0f} | {statistics.median(rel):.2f}x |")
EOF
sq_log "results in $OUT"
