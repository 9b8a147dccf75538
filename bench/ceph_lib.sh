# bench/ceph_lib.sh — a throwaway Ceph cluster on loopback, for bench/ceph_compare.sh and
# bench/ceph_dead_drive.sh (sourced after bench/lib.sh, not run).
#
# One mon (a), one mgr (x) and N BlueStore OSDs, auth none, every file under $SCR. OSD i's
# block device is whatever the symlink $SCR/dev/osd.i points at (a loop device): the caller
# makes it before ceph_osd_add and may point it at a new device before ceph_osd_start (a
# restarted squeeze server gives a new loop device). Discard is on in BlueStore
# (bdev_enable_discard, bdev_async_discard) and the SSD profile forced, as docs/CEPH.md says.
#
#   ceph_need                        check (as root, apt-get install) Debian's Ceph and fio+rbd
#   ceph_conf NOSD SIZE              write $SCR/ceph.conf (pool size SIZE, min_size SIZE-1 or 1)
#   ceph_mon_mgr_up                  mkfs and start the monitor and the manager; wait for quorum
#   ceph_osd_add I                   create OSD I on $SCR/dev/osd.I, start it, wait until up
#   ceph_osd_start I / ceph_osd_pid I / ceph_osd_state I (up, down) / ceph_wait_osd I up|down SECONDS
#   ceph_pool NAME PGS ALG           a replicated rbd pool; BlueStore compression ALG (none: off)
#   ceph_wait_clean SECONDS          every placement group active+clean
#   ceph_stop                        stop every daemon (SIGTERM, then SIGKILL after 10 s)
#   say / fail / now / since T       the pass-or-fail scripts' report: a line on stdout, in
#                                    $OUT/summary.txt and in $OUT/results.jsonl ({"said", "failed"});
#                                    fail sets FAILED=1
#   squeeze_stat SOCKET FIELD        one field of `squeeze stats --json` of a running server
# Needs SCR (scratch dir) and CDIR (where logs of mkfs go); exports CEPH_CONF.
# shellcheck shell=bash

CEPH_MON_ADDR='[v2:127.0.0.1:13300,v1:127.0.0.1:16789]'

ceph_need() {
  local need=() t
  for t in ceph-mon:ceph-mon ceph-mgr:ceph-mgr ceph-osd:ceph-osd ceph:ceph-common rbd:ceph-common \
           monmaptool:ceph-mon fio:fio losetup:mount fusermount3:fuse3 python3:python3 \
           uuidgen:uuid-runtime; do
    command -v "${t%%:*}" >/dev/null || need+=("${t##*:}")
  done
  if ((${#need[@]})); then
    [[ ${INSTALL:-1} != 0 ]] || sq_die "missing ${need[*]} (apt-get install ${need[*]})"
    sq_log "installing ${need[*]} (apt-get; INSTALL=0 to refuse)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2 \
      || sq_die "apt-get install ${need[*]} failed"
  fi
  fio --enghelp 2>/dev/null | grep -qx '[[:space:]]*rbd' || sq_die "this fio has no rbd engine"
}

ceph_wait() { # ceph_wait SECONDS WHAT COMMAND...
  local s=$1 what=$2 i
  shift 2
  for ((i = 0; i < s * 10; i++)); do "$@" >/dev/null 2>&1 && return; sleep 0.1; done
  sq_die "$what did not happen within ${s}s"
}

ceph_conf() { # ceph_conf NOSD SIZE
  local nosd=$1 size=$2 min=1
  ((size > 1)) && min=$((size - 1))
  CEPH_FSID=$(uuidgen)
  mkdir -p "$SCR"/{run,log,mon/a,mgr/x,dev}
  cat >"$SCR/ceph.conf" <<EOF
[global]
fsid = $CEPH_FSID
mon_host = $CEPH_MON_ADDR
public_addr = 127.0.0.1
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
ms_bind_ipv6 = false
osd_pool_default_size = $size
osd_pool_default_min_size = $min
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
osd_crush_chooseleaf_type = 0
run_dir = $SCR/run
pid_file = $SCR/run/\$name.pid
admin_socket = $SCR/run/\$name.asok
log_file = $SCR/log/\$name.log
keyring = $SCR/keyring
osd_objectstore = bluestore
bdev_enable_discard = true
bdev_async_discard = true
bluestore_debug_enforce_settings = ssd
osd_memory_target = $((1536 << 20))
# A dead drive should be noticed in seconds, not the default 20 s.
osd_heartbeat_interval = 2
osd_heartbeat_grace = 8
[mon.a]
mon_data = $SCR/mon/a
[mgr.x]
mgr_data = $SCR/mgr/x
[osd]
osd_data = $SCR/osd/\$id
bluestore_block_path = $SCR/dev/\$name
EOF
  export CEPH_CONF=$SCR/ceph.conf
  # shellcheck disable=SC2034 # for the callers
  CEPH_NOSD=$nosd
}

ceph_mon_mgr_up() {
  ceph-authtool --create-keyring "$SCR/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  monmaptool --create --fsid "$CEPH_FSID" --addv a "$CEPH_MON_ADDR" "$SCR/monmap" >/dev/null
  ceph-mon --mkfs -i a --monmap "$SCR/monmap" >"$CDIR/mon-mkfs.log" 2>&1 \
    || sq_die "ceph-mon --mkfs failed: $(tail -n3 "$CDIR/mon-mkfs.log")"
  ceph-mon -i a || sq_die "ceph-mon did not start (see $SCR/log/mon.a.log)"
  ceph_wait 60 "the monitor's quorum" ceph -s --connect-timeout 5
  ceph-mgr -i x || sq_die "ceph-mgr did not start"
}

ceph_osd_pid() { cat "$SCR/run/osd.$1.pid" 2>/dev/null; }

ceph_osd_state() { # prints up or down (nothing when the monitor does not answer)
  ceph osd dump --format json --connect-timeout 5 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin)
print(next(('up' if o['up'] == 1 else 'down') for o in d['osds'] if o['osd'] == $1))" 2>/dev/null
}

ceph_osd_is() { [[ $(ceph_osd_state "$1") == "$2" ]]; }

ceph_wait_osd() { ceph_wait "$3" "osd.$1 $2" ceph_osd_is "$1" "$2"; } # ceph_wait_osd I up|down SECONDS

ceph_osd_start() {
  ceph-osd -i "$1" || sq_die "ceph-osd -i $1 did not start (see $SCR/log/osd.$1.log)"
}

ceph_osd_add() { # ceph_osd_add I
  local i=$1 uuid id
  [[ -b $(readlink -f "$SCR/dev/osd.$i") ]] || sq_die "$SCR/dev/osd.$i is not a block device"
  uuid=$(uuidgen)
  id=$(ceph osd new "$uuid")
  [[ $id == "$i" ]] || sq_die "the OSD got id $id, not $i"
  mkdir -p "$SCR/osd/$i"
  ceph-osd -i "$i" --mkfs --osd-uuid "$uuid" >"$CDIR/osd.$i-mkfs.log" 2>&1 \
    || sq_die "ceph-osd --mkfs of osd.$i failed: $(tail -n3 "$CDIR/osd.$i-mkfs.log")"
  ceph_osd_start "$i"
  ceph_wait_osd "$i" up 120
}

ceph_pool() { # ceph_pool NAME PGS ALG
  local name=$1 pgs=$2 alg=$3
  ceph osd pool create "$name" "$pgs" "$pgs" >/dev/null 2>&1 || sq_die "cannot create pool $name"
  ceph osd pool application enable "$name" rbd >/dev/null 2>&1
  if [[ $alg == none ]]; then
    ceph osd pool set "$name" compression_mode none >/dev/null
  else
    ceph osd pool set "$name" compression_mode aggressive >/dev/null
    ceph osd pool set "$name" compression_algorithm "$alg" >/dev/null
  fi
}

ceph_clean() { # exit 0 when every placement group is active+clean
  ceph pg stat --format json --connect-timeout 5 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin)
s = d.get('pg_summary', d)
n = s['num_pgs']
c = sum(x['num'] for x in s['num_pg_by_state'] if x['name'] == 'active+clean')
sys.exit(0 if n and c == n else 1)"
}

ceph_wait_clean() { ceph_wait "$1" "every placement group active+clean" ceph_clean; }

ceph_stop() {
  local p
  for p in "$SCR"/run/*.pid; do
    [[ -e $p ]] || continue
    kill "$(cat "$p")" 2>/dev/null || true
  done
  for p in "$SCR"/run/*.pid; do
    [[ -e $p ]] || continue
    for _ in $(seq 100); do kill -0 "$(cat "$p")" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$(cat "$p")" 2>/dev/null || true
    rm -f "$p"
  done
}

# The report of the scripts that pass or fail (ceph_dead_drive.sh, ceph_thin.sh).
# shellcheck disable=SC2034 # read by the callers
FAILED=0
say() { echo "$*" | tee -a "$OUT/summary.txt"; sq_result said="$*" failed:=false; }
# shellcheck disable=SC2034 # read by the callers
fail() { echo "FAIL: $*" | tee -a "$OUT/summary.txt"; sq_result said="FAIL: $*" failed:=true; FAILED=1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; } # seconds since T

squeeze_stat() { # squeeze_stat SOCKET FIELD (the server's one volume)
  "$BIN" stats --json "$1" | python3 -c '
import json, sys
d = json.load(sys.stdin)
d = next(iter(d.values())) if all(isinstance(v, dict) for v in d.values()) else d
print(d[sys.argv[1]])' "$2"
}
