#!/usr/bin/env bash
# bench/dedup.sh — what each peer stores of data with real duplication (issue 38): the three
# Debian root images of bench/dedup_data.sh and two copies of the W3 tar, laid one after another
# (1 MiB aligned) in one sparse disk image, as a user's disk would hold them. Peers, each fed the
# same image:
#   squeeze      `squeeze serve --no-adapt` (zstd:3 throughout), the image written by nbdcopy
#                through NBD; stored = the backing file's allocated bytes (du) after the copy's flush
#   squeeze+dedup  the same volume after `squeeze compact --dedup` (OUT/compact-dedup.json)
#   btrfs        a loop-mounted btrfs with compress-force=zstd:1, the image copied in (sparse),
#                then `duperemove -dr` (Debian's); stored = btrfs's data "used" before and after
#   zstd-3       `zstd -3` of the whole image (128 KiB blocks as squeeze's blobs, and one stream)
#   zstd-3-long  `zstd -3 --long=31`: a 2 GiB window, so the far copies are found
# and `squeeze scan --dedup` of the image (its dedup estimate at 4 KiB).
#
#   sudo bench/dedup.sh
#   BIN=/path/to/squeeze W3_TAR=/var/tmp/fc/w3.tar sudo -E bench/dedup.sh
#
# Holds the bench lock for the whole run. Output: a table (peer, stored bytes, ratio against the
# image's data bytes) on stdout and in OUT/table.md; OUT/results.jsonl.
# Env: PEERS ("squeeze btrfs zstd scan": which of the above to run; their stored bytes do not
#      depend on the machine's speed, so a run of some may be set beside an older run of the rest),
#      W3_TAR (/var/tmp/fc/w3.tar or the harness's usr.tar), DEDUP_DATA (bench/dedup_data.sh's),
#      SCRATCH_BASE (/var/tmp), DUPEREMOVE_BLOCK (duperemove -b, default 128k as duperemove's),
#      BIN, OUT, BENCH_LOCK.
set -euo pipefail

SQ_PROG=bench/dedup.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W3_TAR=${W3_TAR:-/var/tmp/fc/w3.tar}
[[ -s $W3_TAR ]] || W3_TAR=${XDG_CACHE_HOME:-$HOME/.cache}/squeeze-bench/usr.tar
DUPEREMOVE_BLOCK=${DUPEREMOVE_BLOCK:-128k}
PEERS=${PEERS:-squeeze btrfs zstd scan}
want() { [[ " $PEERS " == *" $1 "* ]]; }
NBDCOPY_OPTS=(--flush -S 0 -C 1 -T 1 --request-size=1048576 -R 16)

[[ $(id -u) == 0 ]] || sq_die "run as root (loop mounts, debootstrap)"
[[ -s $W3_TAR ]] || sq_die "no W3 tar ($W3_TAR): set W3_TAR"
for t in nbdcopy nbdinfo zstd mkfs.btrfs duperemove losetup flock; do
  command -v "$t" >/dev/null || sq_die "missing $t (apt-get install nbd-client libnbd-bin zstd btrfs-progs duperemove)"
done
mapfile -t IMAGES < <(bash "$HERE/dedup_data.sh" | sed 's/ (cached)$//')
((${#IMAGES[@]} == 3)) || sq_die "bench/dedup_data.sh gave ${#IMAGES[@]} images, not 3"
sq_lock
sq_bin
SCR=$(mktemp -d "${SCRATCH_BASE:-/var/tmp}/squeeze-dedup.XXXXXX")
MNT=""
cleanup() {
  sq_serve_stop_all
  [[ -z $MNT ]] || umount "$MNT" 2>/dev/null || true
  rm -rf "$SCR"
}
sq_on_exit cleanup
sq_out dedup "$SCR"

# The disk: each input at the next MiB boundary, sparse.
DISK=$SCR/disk.img
off=0
for f in "${IMAGES[@]}" "$W3_TAR" "$W3_TAR"; do
  dd if="$f" of="$DISK" bs=1M seek=$((off >> 20)) conv=sparse,notrunc status=none
  off=$(((off + $(stat -c %s "$f") + (1 << 20) - 1) >> 20 << 20))
done
truncate -s "$off" "$DISK"
DATA=$(du -B1 "$DISK" | cut -f1)
sq_log "disk image: $off bytes logical, $DATA bytes of data (${IMAGES[*]##*/}, 2 x ${W3_TAR##*/})"
row() { # row PEER STORED [NOTE]
  awk -v p="$1" -v s="$2" -v d="$DATA" -v n="${3:-}" \
    'BEGIN { printf "{\"peer\":\"%s\",\"stored_bytes\":%.0f,\"data_bytes\":%.0f,\"ratio\":%.4f,\"note\":\"%s\"}\n", p, s, d, d / s, n }'
}

# squeeze, through NBD.
if want squeeze; then
D=$SCR/squeeze
mkdir -p "$D"
sq_serve_start squeeze "$D/server.log" -- --socket "$D/nbd.sock" --size "$off" --no-adapt "$D/vol.sqz"
nbdcopy "${NBDCOPY_OPTS[@]}" "$DISK" "nbd+unix:///?socket=$D/nbd.sock"
sq_serve_stop squeeze
row squeeze "$(du -B1 "$D/vol.sqz" | cut -f1)" "zstd:3, no dedup (--no-adapt)" | sq_emit
# The same volume deduplicated offline, the copies' records cleaned away.
"$BIN" compact --dedup --json "$D/vol.sqz" >"$OUT/compact-dedup.json"
row squeeze+dedup "$(du -B1 "$D/vol.sqz" | cut -f1)" "zstd:3, compact --dedup (index 256 MiB)" | sq_emit
fi

# btrfs compress-force=zstd:1, then duperemove.
if want btrfs; then
B=$SCR/btrfs
mkdir -p "$B/mnt"
truncate -s $((off * 2)) "$B/fs.img"
mkfs.btrfs -q -f "$B/fs.img"
mount -o loop,compress-force=zstd:1 "$B/fs.img" "$B/mnt"
MNT=$B/mnt
cp --sparse=always "$DISK" "$B/mnt/disk.img"
sync
btrfs_used() { sync; btrfs filesystem sync "$B/mnt"; btrfs filesystem df -b "$B/mnt" | awk -F'used=' '/^Data/ { print $2 + 0 }'; }
row btrfs "$(btrfs_used)" "compress-force=zstd:1" | sq_emit
duperemove -dr -b "$DUPEREMOVE_BLOCK" --hashfile="$B/hashes" "$B/mnt" >"$B/duperemove.log" 2>&1 ||
  sq_die "duperemove failed: $(tail -n3 "$B/duperemove.log")"
row btrfs+duperemove "$(btrfs_used)" "compress-force=zstd:1, duperemove -dr -b $DUPEREMOVE_BLOCK" | sq_emit
umount "$B/mnt"
MNT=""
rm -f "$B/fs.img"
fi

# zstd alone.
if want zstd; then
row zstd-3-128k "$(split -b 128K --filter='zstd -3 -q -c | wc -c' "$DISK" | awk '{ s += $1 } END { print s }')" \
  "zstd -3 of each 128 KiB block (zero blocks included)" | sq_emit
row zstd-3 "$(zstd -3 -q -c "$DISK" | wc -c)" "one stream" | sq_emit
row zstd-3-long "$(zstd -3 --long=31 -q -c "$DISK" | wc -c)" "one stream, --long=31" | sq_emit
fi

# squeeze scan's estimate.
want scan && "$BIN" scan --dedup --json --sample-mib 64 "$DISK" >"$OUT/scan.json"
want scan && python3 - "$OUT/scan.json" <<'EOF' | sq_emit
import json, sys
d = json.load(open(sys.argv[1]))["dedup"]
print(json.dumps({"peer": "scan-dedup-estimate", "duplicate_fraction": d["duplicate_fraction"],
                  "bytes_saved_estimate": d["bytes_saved_estimate"], "sample_rate": d["sample_rate"]}))
EOF
sq_table
cat "$OUT/table.md"
