#!/bin/bash
# The kernel's NBD client through `squeeze nbd-attach`, and its survival of
# the server's crash. Runs INSIDE the test guest, as root
# (scripts/guest/test.sh nbd_attach):
#
#   squeeze serve --restartable (Unix socket) -> squeeze nbd-attach -C 2 /dev/nbd0 (netlink,
#   with a dead-connection timeout) -> ext4; a writer fsyncs files in a loop
#   while the server is SIGKILLed and started again on the same socket
#   several times (nbd-attach hands the kernel new sockets each time); the
#   file system stays mounted, the writer sees no error, every file fsynced
#   before a kill reads back intact, e2fsck -fn is clean; fstrim and
#   blkdiscard -z reach the server as trims and write-zeroes; SIGTERM to
#   nbd-attach disconnects the device; squeeze check.
#
# Each check prints a PASS: or FAIL: line; the last line counts them, and the
# exit status is non-zero when any failed.
#
# Environment: SQUEEZE_BIN (the binary; run.sh sets it), GUEST_OUT (where logs
# go), SQUEEZE_TEST_SIZE (volume size, default 8G), SQUEEZE_TEST_KILLS (server
# SIGKILLs under the writer, default 3), SQUEEZE_TEST_NBD_TIMEOUT (nbd-attach's
# request timeout in seconds, default 10: a request in flight when the server
# dies is sent again after it).
# shellcheck disable=SC2317 # functions called through check
set -u
BIN=${SQUEEZE_BIN:-squeeze}
OUT=${GUEST_OUT:-/tmp}
SIZE=${SQUEEZE_TEST_SIZE:-8G}
KILLS=${SQUEEZE_TEST_KILLS:-3}
TIMEOUT_S=${SQUEEZE_TEST_NBD_TIMEOUT:-10}
W=/var/tmp/nbd-attach-test
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
ATTACH_PID=
WRITER_PID=
exec 3>&1 # say writes here, also from under a redirected command
# shellcheck source=tests/guest/lib/common.sh
. "$(dirname "$0")/lib/common.sh"
# serve LOG: start the server on the volume and socket; wait for its control socket.
serve() {
  rm -f "$SOCK" "$CTL"
  # --restartable: answered writes outlive the process (the file system
  # goes on trusting them across the restart).
  "$BIN" serve --restartable --socket "$SOCK" "$VOL" >"$1" 2>&1 &
  SERVER_PID=$!
  local _
  for _ in $(seq 300); do
    [[ -S $SOCK && -S $CTL ]] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  sed 's/^/  serve: /' "$1" | tail -n 10
  return 1
}
# reconnections: how many times nbd-attach said all its connections are back.
reconnections() { grep -c 'reconnected,' "$OUT/nbd-attach.log"; }
finish() {
  if [[ -n $WRITER_PID ]]; then
    touch "$W/stop"
    wait "$WRITER_PID"
  fi
  mountpoint -q "$MNT" && umount "$MNT"
  if [[ -n $ATTACH_PID ]] && kill -0 "$ATTACH_PID" 2>/dev/null; then
    kill -TERM "$ATTACH_PID"
    wait "$ATTACH_PID"
  fi
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID"
  fi
  # The kernel's view: an I/O error or a file system error is a failure.
  # ("Dead connection, failed to find a fallback" and "Connection timed
  # out, retrying" are expected while the server is down: the requests
  # wait for the reconnection.)
  if dmesg | grep -E 'nbd[0-9]|I/O error|EXT4-fs (error|warning)|blk_update_request|Buffer I/O' >"$OUT/nbd-dmesg.txt"; then
    if grep -q -E 'I/O error|EXT4-fs error|blk_update_request|Buffer I/O' "$OUT/nbd-dmesg.txt"; then
      fail "kernel log has I/O errors:"
      sed 's/^/  dmesg: /' "$OUT/nbd-dmesg.txt" | head -n 20
    fi
  fi
  say "done"
  echo "nbd_attach: $passed passed, $failed failed"
  ((failed == 0 && passed > 0))
  exit
}

rm -rf "$W" && mkdir -p "$W" "$MNT"
say "squeeze $("$BIN" --version | cut -d' ' -f2), kernel $(uname -r)"
[[ -b $DEV ]] || modprobe nbd
check "$DEV is there (nbd loaded)" test -b "$DEV"
[[ -b $DEV ]] || finish

# --- serve and attach --------------------------------------------------------
check "squeeze create --size $SIZE" "$BIN" create --size "$SIZE" "$VOL"
timed "serve" serve "$OUT/serve-0.log"
check "squeeze serve listens on $SOCK" test -S "$SOCK"
"$BIN" nbd-attach --socket "$SOCK" -N vol --probe >"$OUT/probe.txt" 2>&1
check "nbd-attach --probe: $(head -n1 "$OUT/probe.txt")" grep -q 'flags:.*flush fua trim write-zeroes' "$OUT/probe.txt"
"$BIN" nbd-attach --socket "$SOCK" -N nope --probe >"$OUT/probe-nope.txt" 2>&1
check "nbd-attach refuses an unknown export by name: $(tail -n1 "$OUT/probe-nope.txt")" \
  sh -c "grep -q 'refused export \"nope\"' '$OUT/probe-nope.txt'"

"$BIN" nbd-attach --socket "$SOCK" -N vol -C 2 -t "$TIMEOUT_S" --dead-timeout 120 "$DEV" >"$OUT/nbd-attach.log" 2>&1 &
ATTACH_PID=$!
for _ in $(seq 300); do
  grep -q "connected:" "$OUT/nbd-attach.log" && break
  kill -0 "$ATTACH_PID" 2>/dev/null || break
  sleep 0.1
done
sed 's/^/  nbd-attach: /' "$OUT/nbd-attach.log"
check "squeeze nbd-attach -C 2 $DEV: connected" grep -q "/dev/nbd0 connected:" "$OUT/nbd-attach.log"
size=$(blockdev --getsize64 "$DEV" 2>/dev/null || echo 0)
check "$DEV is $SIZE ($size bytes)" test "$size" -eq "$(numfmt --from=iec "$SIZE")"
((size > 0)) || finish
check "the server has 2 connections open" test "$(counter connections_open)" = 2
q=/sys/block/nbd0/queue
say "queue: write_cache=$(cat $q/write_cache) fua=$(cat $q/fua) discard_max_bytes=$(cat $q/discard_max_bytes)" \
  "write_zeroes_max_bytes=$(cat $q/write_zeroes_max_bytes) logical_block_size=$(cat $q/logical_block_size)" \
  "timeout=$(cat $q/io_timeout 2>/dev/null) ms"
check "the kernel sends flushes ($q/write_cache: write back)" grep -q 'write back' $q/write_cache
check "the kernel sends FUA writes ($q/fua: 1)" grep -q 1 $q/fua
check "the kernel sends trims (discard_max_bytes > 0)" test "$(cat $q/discard_max_bytes)" -gt 0
check "the block size is 4096" test "$(cat $q/logical_block_size)" -eq 4096
check "the request timeout is ${TIMEOUT_S} s" test "$(cat $q/io_timeout)" -eq $((TIMEOUT_S * 1000))
"$BIN" nbd-attach --socket "$SOCK" -N vol "$DEV" >"$OUT/busy.txt" 2>&1
check "a second nbd-attach on $DEV is refused as busy: $(tail -n1 "$OUT/busy.txt")" grep -q 'in use' "$OUT/busy.txt"

# --- a file system, and the crash test ---------------------------------------
timed "mkfs.ext4" mkfs.ext4 -q -F "$DEV"
check "mkfs.ext4 $DEV" test $? -eq 0
check "mount $DEV $MNT" mount "$DEV" "$MNT"
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
  back0=$(reconnections)
  kill -KILL "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null
  say "kill $k: SIGKILL with $before files fsynced"
  sleep $((1 + RANDOM % 3)) # down for 1-3 s
  if ! timed "restart $k" serve "$OUT/serve-$k.log"; then
    fail "restart $k: the server did not start"
    continue
  fi
  # nbd-attach reconnects both connections; the writer goes on.
  for _ in $(seq 600); do
    (($(reconnections) > back0)) && break
    sleep 0.1
  done
  if (($(reconnections) > back0)); then
    restart_ok=$((restart_ok + 1))
    say "restart $k: $(grep 'reconnected,' "$OUT/nbd-attach.log" | tail -n1)"
  else
    fail "restart $k: nbd-attach did not reconnect within 60 s"
    tail -n 5 "$OUT/nbd-attach.log" | sed 's/^/  nbd-attach: /'
  fi
  for _ in $(seq 600); do
    (($(wc -l <"$W/fsynced") > before)) && break
    sleep 0.1
  done
done
check "the server was SIGKILLed and restarted $KILLS times; nbd-attach reconnected each time" test "$restart_ok" -eq "$KILLS"
check "the server has 2 connections open again" test "$(counter connections_open)" = 2
sleep 2
touch "$W/stop"
wait "$WRITER_PID"
WRITER_PID=
nfiles=$(wc -l <"$W/fsynced")
say "the writer fsynced $nfiles files"
check "the writer made progress across the kills ($nfiles files fsynced)" test "$nfiles" -gt $((KILLS * 2))
check "the writer saw no I/O error" test ! -s "$W/writer.err"
sed 's/^/  writer: /' "$W/writer.err" | head -n 5
check "$MNT stayed mounted read-write" sh -c "grep -q ' $MNT ext4 rw' /proc/mounts"

# --- trims and write-zeroes after the restarts --------------------------------
dd if=/dev/urandom of="$MNT/trim-me" bs=1M count=32 conv=fsync status=none
rm "$MNT/trim-me"
sync
trims0=$(counter trim)
timed "fstrim" fstrim -v "$MNT"
check "fstrim $MNT reached the new server as trims ($trims0 -> $(counter trim))" test "$(counter trim)" -gt "$trims0"
check "umount $MNT" umount "$MNT"
timed "e2fsck -fn" e2fsck -fn "$DEV" >"$OUT/e2fsck.txt" 2>&1
check "e2fsck -fn $DEV is clean after the kills" test $? -eq 0
tail -n 3 "$OUT/e2fsck.txt" | sed 's/^/  e2fsck: /'
check "mount $DEV $MNT again (read-only)" mount -o ro "$DEV" "$MNT"
check "every one of the $nfiles files fsynced reads back intact" intact
umount "$MNT"
base=$((1 * GiB))
dd if=/dev/urandom of="$W/random" bs=1M count=8 status=none
dd if="$W/random" of="$DEV" bs=1M seek=$((base / MiB)) oflag=direct conv=fsync status=none
wz0=$(counter write_zeroes)
blkdiscard -f -z -o $((base + 2 * MiB)) -l $((4 * MiB)) "$DEV"
check "blkdiscard -z on $DEV" test $? -eq 0
check "the 4 MiB range reads back as zeros" cmp -s -n $((4 * MiB)) /dev/zero <(read_mib $((base + 2 * MiB)) 4)
check "the 2 MiB before it still hold the random data" cmp -s -n $((2 * MiB)) "$W/random" <(read_mib "$base" 2)
if (($(cat $q/write_zeroes_max_bytes) > 0)); then
  check "blkdiscard -z reached the server as write_zeroes ($wz0 -> $(counter write_zeroes))" \
    test "$(counter write_zeroes)" -gt "$wz0"
fi

# --- disconnect, stop, check -------------------------------------------------
kill -TERM "$ATTACH_PID"
timed "nbd-attach after SIGTERM" wait "$ATTACH_PID"
check "nbd-attach exits 0 on SIGTERM" test $? -eq 0
ATTACH_PID=
sed 's/^/  nbd-attach: /' "$OUT/nbd-attach.log" | tail -n 3
for _ in $(seq 50); do
  [[ $(counter connections_open) == 0 ]] && break
  sleep 0.2
done
check "the server sees both connections closed" test "$(counter connections_open)" = 0
check "$DEV is disconnected (size 0)" test "$(blockdev --getsize64 "$DEV" 2>/dev/null || echo 0)" -eq 0
kill -TERM "$SERVER_PID"
timed "squeeze serve after SIGTERM" wait "$SERVER_PID"
check "squeeze serve exits 0 on SIGTERM" test $? -eq 0
SERVER_PID=
timed "squeeze check" "$BIN" check "$VOL" >"$OUT/check.txt" 2>&1
check "squeeze check $VOL is clean" test $? -eq 0
finish
