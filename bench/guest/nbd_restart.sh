#!/bin/bash
# bench/guest/nbd_restart.sh — what the kernel's nbd client does when `squeeze serve` is
# SIGKILLed and started again on the same socket (issue 35). Runs INSIDE the test guest, as
# root:
#
#   scripts/guest/run.sh target/release/squeeze bench/guest/nbd_restart.sh /tmp/nbd-restart
#
# A probe, not a test (it passes or fails nothing: it reports): for each nbd-client mode in
# SQUEEZE_TEST_MODES it connects /dev/nbd0, makes ext4 on it, mounts it, writes and fsyncs a
# file, SIGKILLs the server, and looks at the device and the file system while the server is
# down (a direct read of the device, a write and fsync on the file system), starts the server
# again on the same socket, waits, and looks again: the device's size, nbd-client's process,
# a direct read, a write and fsync, the fsynced file, and the kernel's log. Each look prints
# one "observe:" line, with how long the operation took and its status.
#
# Modes (nbd-client 3.24, Debian bookworm):
#   netlink     nbd-client -unix SOCK /dev/nbd0 -N vol -C 2 -b 4096 -t 10 (the default interface)
#   persist     the same with -persist (netlink: nbd-client exits once the device is set up)
#   ioctl       -nonetlink -persist -t 10 (one connection: -C needs netlink): the nbd-client
#               process stays in NBD_DO_IT and reconnects when it returns
#
# Environment: SQUEEZE_TEST_MODES ("netlink persist ioctl"), SQUEEZE_TEST_WAIT (seconds to wait
# after the restart before looking, 20).
set -u
BIN=${SQUEEZE_BIN:-squeeze}
OUT=${GUEST_OUT:-/tmp}
MODES=${SQUEEZE_TEST_MODES:-netlink persist ioctl}
WAIT=${SQUEEZE_TEST_WAIT:-20}
W=/var/tmp/nbd-restart
DEV=/dev/nbd0
MNT=/mnt/nbd
T0=$(date +%s)
SERVER_PID=
say() { echo "[$(($(date +%s) - T0)) s] $*"; }
# observe WHAT CMD...: run CMD with a 30 s limit, print how long it took and its status.
observe() {
  local what=$1 t rc=0 out
  shift
  t=$(date +%s.%N)
  out=$(timeout 30 "$@" 2>&1) || rc=$?
  printf 'observe: %-44s status %3d after %5.1f s%s\n' "$what" "$rc" \
    "$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" "${out:+: $(echo "$out" | tail -n1 | cut -c1-100)}"
}
state() {
  say "state: size $(cat /sys/block/nbd0/size 2>/dev/null) sectors, pid $(cat /sys/block/nbd0/pid 2>/dev/null || echo none)," \
    "nbd-client processes: $(pgrep -x nbd-client | tr '\n' ' ')"
}
serve() {
  "$BIN" serve --socket "$W/nbd.sock" "$W/vol.sqz" >>"$OUT/nbd-restart-serve.log" 2>&1 &
  SERVER_PID=$!
  local _
  for _ in $(seq 100); do
    [[ -S $W/vol.ctl ]] && return 0
    sleep 0.2
  done
  return 1
}

for mode in $MODES; do
  say "=== mode $mode"
  rm -rf "$W" && mkdir -p "$W" "$MNT"
  "$BIN" create --size 4G "$W/vol.sqz" >/dev/null
  serve || say "the server did not start"
  case $mode in
    netlink) args=(-N vol -C 2 -b 4096 -t 10) ;;
    persist) args=(-N vol -C 2 -b 4096 -t 10 -persist) ;;
    ioctl) args=(-N vol -b 4096 -t 10 -nonetlink -persist) ;;
  esac
  dmesg -C
  nbd-client -unix "$W/nbd.sock" "$DEV" "${args[@]}" >"$OUT/nbd-restart-$mode-client.log" 2>&1
  say "nbd-client ${args[*]}: status $?"
  sleep 1
  client_pid=$(cat /sys/block/nbd0/pid 2>/dev/null)
  state
  if ! { mkfs.ext4 -q -F "$DEV" && mount "$DEV" "$MNT"; }; then say "mkfs or mount failed"; fi
  dd if=/dev/urandom of="$MNT/before" bs=1M count=4 conv=fsync status=none
  sum_before=$(md5sum <"$MNT/before")
  say "server SIGKILL (pid $SERVER_PID)"
  kill -9 "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null
  sleep 1
  state
  observe "server down: direct read of $DEV" dd if="$DEV" of=/dev/null bs=4k count=1 skip=100 iflag=direct status=none
  observe "server down: write+fsync on the fs" dd if=/dev/zero of="$MNT/during" bs=4k count=1 conv=fsync status=none
  say "server restarted on the same socket"
  serve || say "the server did not start again"
  sleep "$WAIT"
  state
  observe "after restart: direct read of $DEV" dd if="$DEV" of=/dev/null bs=4k count=1 skip=200 iflag=direct status=none
  observe "after restart: write+fsync on the fs" dd if=/dev/zero of="$MNT/after" bs=4k count=1 conv=fsync status=none
  observe "after restart: the fsynced file reads back" sh -c "echo 3 >/proc/sys/vm/drop_caches; test \"\$(md5sum <$MNT/before)\" = \"$sum_before\""
  observe "after restart: a new open of $DEV" blockdev --getsize64 "$DEV"
  say "nbd-client's output:"
  sed 's/^/  nbd-client: /' "$OUT/nbd-restart-$mode-client.log" | tail -n 8
  say "kernel log:"
  dmesg | grep -E 'nbd|EXT4|I/O error|Buffer' | head -n 15 | sed 's/^/  dmesg: /'
  umount "$MNT" 2>/dev/null || umount -l "$MNT"
  observe "umount, then a new mount" sh -c "mount $DEV $MNT && umount $MNT"
  nbd-client -d "$DEV" >/dev/null 2>&1
  # ioctl mode: the client still in NBD_DO_IT, by the PID it had after connecting
  [[ $mode != ioctl || -z $client_pid ]] || kill "$client_pid" 2>/dev/null
  kill -TERM "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  sleep 1
done
say "done"
