#!/bin/bash
# squeeze as a ublk block device, and its survival of its own crash. Runs
# INSIDE the test guest, as root (scripts/guest/test.sh ublk):
#
#   squeeze serve --ublk --ublk-id 0 -> /dev/ublkb0 -> ext4 -> a copy of /usr
#   -> umount, mount -> diff -r; fstrim gives space back; blkdiscard -z of a
#   range reads back zeros; fio verify on the raw device; then the crash test:
#   a writer fsyncs files in a loop while the server is SIGKILLed and started
#   again (it takes the device over: START_USER_RECOVERY; every other restart
#   finds the device without --ublk-id) several times; the
#   file system stays mounted, the writer sees no error, every file fsynced
#   before a kill reads back intact, e2fsck -fn is clean; SIGTERM removes the
#   device; squeeze check.
#
# Each check prints a PASS: or FAIL: line; the last line counts them, and the
# exit status is non-zero when any failed.
#
# Environment: SQUEEZE_BIN (the binary; run.sh sets it), GUEST_OUT (where logs
# go), SQUEEZE_TEST_COPY (directories copied onto the device; default
# /usr/bin /usr/sbin /usr/share), SQUEEZE_TEST_SIZE (volume size, default 8G),
# SQUEEZE_TEST_FIO_SIZE (64M), SQUEEZE_TEST_KILLS (server SIGKILLs under the
# writer, default 4).
# shellcheck disable=SC2317 # functions called through check
set -u
BIN=${SQUEEZE_BIN:-squeeze}
OUT=${GUEST_OUT:-/tmp}
COPY=${SQUEEZE_TEST_COPY:-/usr/bin /usr/sbin /usr/share}
SIZE=${SQUEEZE_TEST_SIZE:-8G}
FIO_SIZE=${SQUEEZE_TEST_FIO_SIZE:-64M}
KILLS=${SQUEEZE_TEST_KILLS:-4}
W=/var/tmp/ublk-test
VOL=$W/vol.sqz
CTL=$W/vol.ctl
DEV=/dev/ublkb0
MNT=/mnt/ublk
MiB=$((1 << 20))
GiB=$((1 << 30))

T0=$(date +%s)
passed=0
failed=0
SERVER_PID=
WRITER_PID=
exec 3>&1 # say writes here, also from under a redirected command
# shellcheck source=tests/guest/lib/common.sh
. "$(dirname "$0")/lib/common.sh"
# ublk_counter KEY: a number from the "ublk" part of squeeze stats --json
# (the device's request counters; "nbd_server" comes before it).
ublk_counter() {
  "$BIN" stats --json "$CTL" 2>/dev/null | sed -n '/"ublk": {/,$p' | sed -n "s/^ *\"$1\": \([0-9.]*\),\{0,1\}$/\1/p" | head -n1
}
# serve LOG [ID_ARGS...]: start the server on the volume (ublk, no NBD; by
# default as device 0: --ublk-id 0), wait until it prints the device; the PID
# in SERVER_PID.
serve() {
  local log=$1
  shift
  (($#)) || set -- --ublk-id 0
  "$BIN" serve --ublk "$@" --ublk-queues 2 "$VOL" >"$log" 2>&1 &
  SERVER_PID=$!
  local _
  for _ in $(seq 600); do
    grep -q "block device: $DEV" "$log" && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  sed 's/^/  serve: /' "$log" | tail -n 20
  return 1
}
finish() {
  if [[ -n $WRITER_PID ]]; then
    touch "$W/stop"
    wait "$WRITER_PID"
  fi
  mountpoint -q "$MNT" && umount "$MNT"
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID"
  fi
  # The kernel log up to DMESG_LINES: the stop under a mounted file system
  # at the end makes I/O errors on purpose.
  if dmesg | head -n "${DMESG_LINES:-1000000}" |
    grep -E 'ublk|I/O error|EXT4-fs (error|warning)|blk_update_request|Buffer I/O' >"$OUT/ublk-dmesg.txt"; then
    if grep -q -E 'I/O error|EXT4-fs error|blk_update_request|Buffer I/O' "$OUT/ublk-dmesg.txt"; then
      fail "kernel log has I/O errors:"
      sed 's/^/  dmesg: /' "$OUT/ublk-dmesg.txt" | head -n 20
    fi
  fi
  say "done"
  echo "ublk: $passed passed, $failed failed"
  ((failed == 0 && passed > 0))
  exit
}

rm -rf "$W" && mkdir -p "$W" "$MNT"
say "squeeze $("$BIN" --version | cut -d' ' -f2), kernel $(uname -r)"
[[ -c /dev/ublk-control ]] || modprobe ublk_drv
check "/dev/ublk-control is there (ublk_drv loaded)" test -c /dev/ublk-control
[[ -c /dev/ublk-control ]] || finish

# --- serve -------------------------------------------------------------------
check "squeeze create --size $SIZE" "$BIN" create --size "$SIZE" "$VOL"
timed "serve --ublk: device up" serve "$OUT/serve-0.log"
check "squeeze serve --ublk --ublk-id 0 brings up $DEV" test -b "$DEV"
[[ -b $DEV ]] || finish
sed 's/^/  serve: /' "$OUT/serve-0.log" | grep -E 'block device|ublk' | head -n 5
size=$(blockdev --getsize64 "$DEV" 2>/dev/null || echo 0)
check "$DEV is $SIZE ($size bytes)" test "$size" -eq "$(numfmt --from=iec "$SIZE")"
q=/sys/block/ublkb0/queue
say "queue: write_cache=$(cat $q/write_cache) fua=$(cat $q/fua 2>/dev/null) discard_granularity=$(cat $q/discard_granularity)" \
  "discard_max_bytes=$(cat $q/discard_max_bytes) write_zeroes_max_bytes=$(cat $q/write_zeroes_max_bytes)" \
  "logical_block_size=$(cat $q/logical_block_size) physical_block_size=$(cat $q/physical_block_size)" \
  "max_sectors_kb=$(cat $q/max_sectors_kb) nr_hw_queues=$(ls /sys/block/ublkb0/mq | wc -l)"
check "the kernel sends flushes ($q/write_cache: write back)" grep -q 'write back' $q/write_cache
check "the kernel sends FUA writes ($q/fua: 1)" grep -q 1 $q/fua
check "the kernel sends discards in 4 KiB granules" test "$(cat $q/discard_granularity)" -eq 4096 -a "$(cat $q/discard_max_bytes)" -gt 0
check "the kernel sends write-zeroes" test "$(cat $q/write_zeroes_max_bytes)" -gt 0

# --- a file system -----------------------------------------------------------
timed "mkfs.ext4 (discards the device first)" mkfs.ext4 -q -F "$DEV"
check "mkfs.ext4 $DEV" test $? -eq 0
check "mount $DEV $MNT" mount "$DEV" "$MNT"
mountpoint -q "$MNT" || finish
# shellcheck disable=SC2086 # COPY is a list
say "copying $COPY ($(du -sch $COPY 2>/dev/null | tail -n1 | cut -f1), $(find $COPY -type f | wc -l) files) onto the device"
timed "cp -a" copy_all
check "cp -a each of $COPY to $MNT/copy/..." test $? -eq 0
flushes0=$(ublk_counter flush)
timed "sync" sync
check "sync" test $? -eq 0
check "sync reached the server as ublk flushes ($flushes0 -> $(ublk_counter flush))" test "$(ublk_counter flush)" -gt "$flushes0"
check "umount and mount again" sh -c "umount $MNT && mount $DEV $MNT"
timed "diff -r" diff_all
check "diff -r of each copied directory is clean" test $? -eq 0
cat "$OUT"/diff-*.txt | head -n 20 | sed 's/^/  diff: /'

# --- fstrim: freed blocks leave the volume -----------------------------------
rm -rf "$MNT/copy"
sync
mapped0=$(counter mapped_bytes)
discards0=$(ublk_counter discard)
timed "fstrim" fstrim -v "$MNT"
check "fstrim $MNT" test $? -eq 0
mapped1=$(counter mapped_bytes)
check "fstrim reached the server as ublk discards ($discards0 -> $(ublk_counter discard))" test "$(ublk_counter discard)" -gt "$discards0"
# shellcheck disable=SC2086
copied=$(du -s --block-size=1 $COPY | awk '{ n += $1 } END { print n }')
check "fstrim unmapped at least 3/4 of the $((copied / MiB)) MiB deleted (squeeze stats: mapped $((mapped0 / MiB)) MiB -> $((mapped1 / MiB)) MiB)" \
  test $((mapped0 - mapped1)) -ge $((copied * 3 / 4))
check "umount $MNT" umount "$MNT"

# --- write-zeroes: blkdiscard -z on a range ----------------------------------
base=$((1 * GiB))
dd if=/dev/urandom of="$W/random" bs=1M count=32 status=none
dd if="$W/random" of="$DEV" bs=1M seek=$((base / MiB)) oflag=direct conv=fsync status=none
check "32 MiB of random data written at 1 GiB read back" cmp -s "$W/random" <(read_mib "$base" 32)
wz0=$(ublk_counter write_zeroes)
timed "blkdiscard -z" blkdiscard -f -z -o $((base + 8 * MiB)) -l $((16 * MiB)) "$DEV"
check "blkdiscard -f -z -o $((base + 8 * MiB)) -l $((16 * MiB)) $DEV" test $? -eq 0
check "blkdiscard -z reached the server as ublk write-zeroes ($wz0 -> $(ublk_counter write_zeroes))" \
  test "$(ublk_counter write_zeroes)" -gt "$wz0"
check "the 16 MiB range reads back as zeros" cmp -s -n $((16 * MiB)) /dev/zero <(read_mib $((base + 8 * MiB)) 16)
check "the 8 MiB before and after it still hold the random data" around_intact

# --- fio verify on the raw device --------------------------------------------
if command -v fio >/dev/null; then
  timed "fio verify" fio --name=verify --filename="$DEV" --direct=1 --ioengine=libaio --iodepth=16 \
    --rw=randwrite --bsrange=4k-256k --offset=$((2 * GiB)) --size="$FIO_SIZE" \
    --verify=crc32c --verify_fatal=1 --do_verify=1 --output="$OUT/fio.txt"
  check "fio randwrite $FIO_SIZE (4k-256k, iodepth 16) then verify crc32c" test $? -eq 0
  grep -E 'WRITE:|READ:|err=' "$OUT/fio.txt" | sed 's/^ */  fio: /'
else
  say "no fio in the guest: skipped"
fi

# --- the crash test ----------------------------------------------------------
# A fresh file system; a writer makes files of 64-512 KiB, each written and
# fsynced (dd conv=fsync), and lists a file in $W/fsynced only after its fsync
# returned. Meanwhile the server is SIGKILLed and started again $KILLS times.
timed "mkfs.ext4 for the crash test" mkfs.ext4 -q -F "$DEV"
check "mount $DEV $MNT (crash test)" mount "$DEV" "$MNT"
mountpoint -q "$MNT" || finish
mkdir -p "$MNT/crash" "$W/src"
: >"$W/fsynced"
: >"$W/writer.err"
writer &
WRITER_PID=$!
restart_ok=0
for k in $(seq "$KILLS"); do
  sleep $((3 + RANDOM % 4))
  before=$(wc -l <"$W/fsynced")
  kill -KILL "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null
  say "kill $k: SIGKILL with $before files fsynced"
  sleep 1
  # Even restarts name no id: the server finds the device its predecessor
  # left for the volume (/run/ublksrvd/0000.json names the volume's uuid).
  ids=(--ublk-id 0)
  ((k % 2 == 0)) && ids=(--ublk-depth 64)
  if timed "restart $k (${ids[*]}): device taken over" serve "$OUT/serve-$k.log" "${ids[@]}" &&
    grep -q "taken over" "$OUT/serve-$k.log"; then
    restart_ok=$((restart_ok + 1))
  else
    fail "restart $k: the new server did not take $DEV over"
    sed 's/^/  serve: /' "$OUT/serve-$k.log" | tail -n 10
    # The writer waits on the quiesced device for as long as no server takes
    # it over: try the plain form once, so the test can end.
    kill -0 "$SERVER_PID" 2>/dev/null || serve "$OUT/serve-$k-retry.log"
  fi
  # The writer goes on: at least one more file fsynced after the takeover.
  for _ in $(seq 600); do
    (($(wc -l <"$W/fsynced") > before)) && break
    sleep 0.1
  done
done
check "the server was SIGKILLed and took $DEV over again $KILLS times" test "$restart_ok" -eq "$KILLS"
check "squeeze stats shows the device taken over" sh -c "'$BIN' stats '$CTL' | grep -q 'ublk device .*$DEV (taken over'"
"$BIN" stats "$CTL" 2>/dev/null | grep '^ublk' | sed 's/^/  /'
sleep 2
touch "$W/stop"
wait "$WRITER_PID"
WRITER_PID=
nfiles=$(wc -l <"$W/fsynced")
say "the writer fsynced $nfiles files"
check "the writer made progress across the kills ($nfiles files fsynced)" test "$nfiles" -gt $((KILLS * 2))
check "the writer saw no I/O error" test ! -s "$W/writer.err"
sed 's/^/  writer: /' "$W/writer.err" | head -n 5
check "$MNT stayed mounted" mountpoint -q "$MNT"
check "umount $MNT" umount "$MNT"
timed "e2fsck -fn" e2fsck -fn "$DEV" >"$OUT/e2fsck.txt" 2>&1
check "e2fsck -fn $DEV is clean after the kills" test $? -eq 0
tail -n 3 "$OUT/e2fsck.txt" | sed 's/^/  e2fsck: /'
check "mount $DEV $MNT again" mount -o ro "$DEV" "$MNT"
check "every one of the $nfiles files fsynced reads back intact" intact
umount "$MNT"

# --- stop, check -------------------------------------------------------------
kill -TERM "$SERVER_PID"
timed "squeeze serve after SIGTERM" wait "$SERVER_PID"
check "squeeze serve exits 0 on SIGTERM" test $? -eq 0
SERVER_PID=
grep -E 'removed' "$OUT/serve-$KILLS.log" | sed 's/^/  serve: /'
check "SIGTERM removed the device (no /dev/ublkb*, no /sys/class/ublk-char/ublkc0)" \
  sh -c '! ls /dev/ublkb* >/dev/null 2>&1 && test ! -e /sys/class/ublk-char/ublkc0'
timed "squeeze check" "$BIN" check "$VOL" >"$OUT/check.txt" 2>&1
check "squeeze check $VOL is clean" test $? -eq 0

# --- SIGTERM with the file system still mounted ------------------------------
# The server exits all the same (the file system gets I/O errors: unmount
# first); the kernel frees the device once the file system lets go.
DMESG_LINES=$(dmesg | wc -l)
serve "$OUT/serve-mounted.log" && mount "$DEV" "$MNT"
check "a new device with the file system mounted again" mountpoint -q "$MNT"
kill -TERM "$SERVER_PID"
for _ in $(seq 300); do
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
check "SIGTERM with $MNT mounted: the server exits within 30 s" sh -c "! kill -0 $SERVER_PID 2>/dev/null"
wait "$SERVER_PID"
check "... with status 0" test $? -eq 0
SERVER_PID=
umount "$MNT" 2>/dev/null
for _ in $(seq 50); do
  [[ -e /sys/class/ublk-char/ublkc0 ]] || break
  sleep 0.1
done
check "the device is gone once unmounted" test ! -e /sys/class/ublk-char/ublkc0
finish
