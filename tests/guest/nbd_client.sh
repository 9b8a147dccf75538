#!/bin/bash
# The kernel's NBD client on squeeze, as an operator uses it. Runs INSIDE the
# test guest, as root (scripts/guest/run.sh squeeze tests/guest/nbd_client.sh):
#
#   squeeze serve (Unix socket) -> nbd-client -unix SOCK /dev/nbd0 -C 2 -> ext4
#   -> a copy of /usr -> umount, mount -> diff -r; fstrim; blkdiscard -z of a
#   range reads back zeros; fio verify on the raw device; disconnect, SIGTERM,
#   squeeze check.
#
# Each check prints a PASS: or FAIL: line; the last line counts them, and the
# exit status is non-zero when any failed. The server's counters (squeeze stats
# --json on the control socket) show that the kernel really sent what each step
# should make it send: two connections, flushes, trims, write-zeroes.
#
# Environment: SQUEEZE_BIN (the binary; run.sh sets it), GUEST_OUT (where logs
# go), SQUEEZE_TEST_COPY (the directories copied onto the device; default
# /usr/bin /usr/sbin /usr/share: 110 MiB in 4,000 files, which keeps the run
# at 1.5 to 3 minutes under TCG; all of /usr, 425 MiB in 10,561 files, 4 to 7),
# SQUEEZE_TEST_SIZE (volume size, default 8G), SQUEEZE_TEST_FIO_SIZE (64M).
# shellcheck disable=SC2317 # functions called through check
set -u
BIN=${SQUEEZE_BIN:-squeeze}
OUT=${GUEST_OUT:-/tmp}
COPY=${SQUEEZE_TEST_COPY:-/usr/bin /usr/sbin /usr/share}
SIZE=${SQUEEZE_TEST_SIZE:-8G}
FIO_SIZE=${SQUEEZE_TEST_FIO_SIZE:-64M}
W=/var/tmp/nbd-client-test
VOL=$W/vol.sqz
SOCK=$W/nbd.sock
CTL=$W/vol.ctl
DEV=/dev/nbd0
MNT=/mnt/nbd
MiB=$((1 << 20))
GiB=$((1 << 30))

T0=$(date +%s)
passed=0
failed=0
SERVER_PID=
exec 3>&1 # say writes here, also from under a redirected command
# shellcheck source=tests/guest/lib/common.sh
. "$(dirname "$0")/lib/common.sh"
finish() {
  mountpoint -q "$MNT" && umount "$MNT"
  [[ -e /sys/block/nbd0/pid ]] && nbd-client -d "$DEV" >/dev/null 2>&1
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID"
  fi
  # The kernel's view: any I/O error or nbd complaint is a failure.
  if dmesg | grep -E 'nbd[0-9]|I/O error|EXT4-fs (error|warning)|blk_update_request' >"$OUT/nbd-dmesg.txt"; then
    if grep -q -E 'I/O error|EXT4-fs error|blk_update_request|timed out|[Dd]ead' "$OUT/nbd-dmesg.txt"; then
      fail "kernel log has nbd or I/O errors:"
      sed 's/^/  dmesg: /' "$OUT/nbd-dmesg.txt" | head -n 20
    fi
  fi
  say "done"
  echo "nbd_client: $passed passed, $failed failed"
  ((failed == 0 && passed > 0))
  exit
}

rm -rf "$W" && mkdir -p "$W" "$MNT"
say "squeeze $("$BIN" --version | cut -d' ' -f2), nbd-client $(nbd-client -V 2>&1 | grep -o '[0-9][0-9.]*' | head -n1), kernel $(uname -r)"
[[ -b $DEV ]] || {
  fail "no $DEV: the nbd module is not loaded"
  finish
}

# --- serve and connect -------------------------------------------------------
check "squeeze create --size $SIZE" "$BIN" create --size "$SIZE" "$VOL"
"$BIN" serve --socket "$SOCK" "$VOL" >"$OUT/serve.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do
  [[ -S $SOCK && -S $CTL ]] && break
  sleep 0.2
done
check "squeeze serve listens on $SOCK" test -S "$SOCK"
if grep -q PR_SET_IO_FLUSHER "$OUT/serve.log"; then
  fail "serve could not set PR_SET_IO_FLUSHER as root: $(grep PR_SET_IO_FLUSHER "$OUT/serve.log")"
fi

# -N vol: the export (the volume file's stem); -C 2: two connections (the server offers multi-conn); -b 4096 the block size
# ext4 uses; -t 120: a request unanswered for 2 minutes fails its connection
# (TCG is slow) instead of hanging forever.
timed "connect" nbd-client -unix "$SOCK" "$DEV" -N vol -C 2 -b 4096 -t 120 >"$OUT/nbd-client.log" 2>&1
check "nbd-client -unix $SOCK $DEV -N vol -C 2 -b 4096 -t 120" test $? -eq 0
size=$(blockdev --getsize64 "$DEV" 2>/dev/null || echo 0)
check "$DEV is $SIZE ($size bytes)" test "$size" -eq "$(numfmt --from=iec "$SIZE")"
if ((size == 0)); then
  sed 's/^/  nbd-client: /' "$OUT/nbd-client.log"
  finish
fi
check "the server has 2 connections open" test "$(counter connections_open)" = 2
q=/sys/block/nbd0/queue
say "queue: write_cache=$(cat $q/write_cache) discard_max_bytes=$(cat $q/discard_max_bytes)" \
  "write_zeroes_max_bytes=$(cat $q/write_zeroes_max_bytes) logical_block_size=$(cat $q/logical_block_size)" \
  "max_sectors_kb=$(cat $q/max_sectors_kb) rotational=$(cat $q/rotational) timeout=$(cat $q/io_timeout 2>/dev/null)"
check "the kernel sends flushes ($q/write_cache: write back)" grep -q 'write back' $q/write_cache
check "the kernel sends trims (discard_max_bytes > 0)" test "$(cat $q/discard_max_bytes)" -gt 0

# --- a file system -----------------------------------------------------------
trims0=$(counter trim)
timed "mkfs.ext4 (discards the device first)" mkfs.ext4 -q -F "$DEV"
check "mkfs.ext4 $DEV" test $? -eq 0
check "mkfs.ext4's discard reached the server as trims ($trims0 -> $(counter trim))" test "$(counter trim)" -gt "$trims0"
check "mount $DEV $MNT" mount "$DEV" "$MNT"
mountpoint -q "$MNT" || finish

# shellcheck disable=SC2086 # COPY is a list
say "copying $COPY ($(du -sch $COPY 2>/dev/null | tail -n1 | cut -f1), $(find $COPY -type f | wc -l) files) onto the device"
timed "cp -a" copy_all
check "cp -a each of $COPY to $MNT/copy/..." test $? -eq 0
flushes0=$(counter flush)
timed "sync" sync
check "sync reached the server as flushes ($flushes0 -> $(counter flush))" test "$(counter flush)" -gt "$flushes0"
# Remount, so that diff reads the device and not the page cache. The
# directories are compared at the same time: more requests in flight.
check "umount and mount again" sh -c "umount $MNT && mount $DEV $MNT"
timed "diff -r" diff_all
check "diff -r of each copied directory is clean" test $? -eq 0
cat "$OUT"/diff-*.txt | head -n 20 | sed 's/^/  diff: /'
"$BIN" stats "$CTL" >"$OUT/stats-after-copy.txt" 2>&1
say "after the copy: $(grep -E '^(mapped|stored|compression ratio)' "$OUT/stats-after-copy.txt" | tr -s ' ' | paste -sd';')"

# --- fstrim: freed blocks leave the volume -----------------------------------
rm -rf "$MNT/copy"
sync
mapped0=$(counter mapped_bytes)
trims0=$(counter trim)
timed "fstrim" fstrim -v "$MNT"
check "fstrim $MNT" test $? -eq 0
mapped1=$(counter mapped_bytes)
check "fstrim reached the server as trims ($trims0 -> $(counter trim))" test "$(counter trim)" -gt "$trims0"
# shellcheck disable=SC2086
copied=$(du -s --block-size=1 $COPY | awk '{ n += $1 } END { print n }')
check "fstrim unmapped at least 3/4 of the $((copied / MiB)) MiB deleted (mapped $((mapped0 / MiB)) MiB -> $((mapped1 / MiB)) MiB)" \
  test $((mapped0 - mapped1)) -ge $((copied * 3 / 4))
check "umount $MNT" umount "$MNT"

# --- write-zeroes: blkdiscard -z on a range ----------------------------------
# 32 MiB of random data at 1 GiB (over the old file system: it is unmounted),
# then write-zeroes on its middle 16 MiB: zeros there, the data around intact.
base=$((1 * GiB))
dd if=/dev/urandom of="$W/random" bs=1M count=32 status=none
dd if="$W/random" of="$DEV" bs=1M seek=$((base / MiB)) oflag=direct conv=fsync status=none
check "32 MiB of random data written at 1 GiB read back" cmp -s "$W/random" <(read_mib "$base" 32)
wz0=$(counter write_zeroes)
timed "blkdiscard -z" blkdiscard -f -z -o $((base + 8 * MiB)) -l $((16 * MiB)) "$DEV"
check "blkdiscard -f -z -o $((base + 8 * MiB)) -l $((16 * MiB)) $DEV" test $? -eq 0
check "the 16 MiB range reads back as zeros" cmp -s -n $((16 * MiB)) /dev/zero <(read_mib $((base + 8 * MiB)) 16)
check "the 8 MiB before and after it still hold the random data" around_intact
if (($(cat $q/write_zeroes_max_bytes) > 0)); then
  check "blkdiscard -z reached the server as write_zeroes ($wz0 -> $(counter write_zeroes))" \
    test "$(counter write_zeroes)" -gt "$wz0"
else
  say "the kernel offers no write-zeroes on $DEV: blkdiscard -z wrote zero pages"
fi

# --- fio verify on the raw device --------------------------------------------
timed "fio verify" fio --name=verify --filename="$DEV" --direct=1 --ioengine=libaio --iodepth=16 \
  --rw=randwrite --bsrange=4k-64k --offset=$((2 * GiB)) --size="$FIO_SIZE" \
  --verify=crc32c --verify_fatal=1 --do_verify=1 --output="$OUT/fio.txt"
check "fio randwrite $FIO_SIZE (4k-64k, iodepth 16) then verify crc32c" test $? -eq 0
grep -E 'WRITE:|READ:|err=' "$OUT/fio.txt" | sed 's/^ */  fio: /'

# --- disconnect, stop, check -------------------------------------------------
timed "nbd-client -d" nbd-client -d "$DEV"
check "nbd-client -d $DEV" test $? -eq 0
for _ in $(seq 50); do
  [[ $(counter connections_open) == 0 ]] && break
  sleep 0.2
done
check "the server sees both connections closed" test "$(counter connections_open)" = 0
check "the server counted no errors" test "$(counter errors)" = 0
"$BIN" stats "$CTL" >"$OUT/stats-final.txt" 2>&1
grep -E '^nbd (server|requests)' "$OUT/stats-final.txt" | sed 's/^/  /'
kill -TERM "$SERVER_PID"
timed "squeeze serve after SIGTERM" wait "$SERVER_PID"
check "squeeze serve exits 0 on SIGTERM" test $? -eq 0
SERVER_PID=
timed "squeeze check" "$BIN" check "$VOL" >"$OUT/check.txt" 2>&1
check "squeeze check $VOL is clean" test $? -eq 0
finish
