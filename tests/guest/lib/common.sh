#!/usr/bin/env bash
# What the guest tests share (tests/guest/*.sh source it; scripts/guest/run.sh
# puts it beside the test in the guest). The test defines what these read
# when called: T0, passed and failed, fd 3 (say), BIN and CTL (counter), DEV
# and MiB (read_mib), COPY, MNT, OUT and W (the copies, the writer, intact),
# base (around_intact).
# shellcheck disable=SC2034,SC2154 # the test sets and reads these globals

say() { echo "[$(($(date +%s) - T0)) s] $*" >&3; }

pass() {
  passed=$((passed + 1))
  echo "PASS: $*"
}

fail() {
  failed=$((failed + 1))
  echo "FAIL: $*"
}

check() {
  local name=$1
  shift
  if "$@"; then pass "$name"; else fail "$name"; fi
}

# counter KEY: a number from the server's squeeze stats --json (first match).
counter() {
  "$BIN" stats --json "$CTL" 2>/dev/null | sed -n "s/^ *\"$1\": \([0-9.]*\),\{0,1\}$/\1/p" | head -n1
}

timed() {
  local name=$1 t rc=0
  t=$(date +%s)
  shift
  "$@" || rc=$?
  say "$name: $(($(date +%s) - t)) s (status $rc)"
  return "$rc"
}

read_mib() { dd if="$DEV" bs=1M skip=$(($1 / MiB)) count="$2" iflag=direct status=none; }

# The writer makes files of 64-512 KiB, each written and fsynced (dd
# conv=fsync), and lists a file in $W/fsynced only after its fsync returned.
writer() {
  local i=0 n
  while [[ ! -e $W/stop ]]; do
    i=$((i + 1))
    n=$((1 + RANDOM % 8))
    head -c $((n * 64 * 1024)) /dev/urandom >"$W/src/f$i"
    if dd if="$W/src/f$i" of="$MNT/crash/f$i" bs=64k conv=fsync status=none 2>>"$W/writer.err"; then
      echo "f$i" >>"$W/fsynced"
    else
      echo "f$i: dd failed" >>"$W/writer.err"
    fi
  done
}

intact() {
  local f bad=0
  while read -r f; do
    cmp -s "$W/src/$f" "$MNT/crash/$f" || {
      echo "  $f differs"
      bad=$((bad + 1))
    }
  done <"$W/fsynced"
  ((bad == 0))
}

copy_all() {
  local d
  for d in $COPY; do
    mkdir -p "$MNT/copy$(dirname "$d")" && cp -a "$d" "$MNT/copy$d" || return 1
  done
}

diff_all() {
  local d i=0 pids=() rc=0
  for d in $COPY; do
    i=$((i + 1))
    diff -r --no-dereference "$d" "$MNT/copy$d" >"$OUT/diff-$i.txt" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  return "$rc"
}

around_intact() {
  cmp -s -n $((8 * MiB)) "$W/random" <(read_mib "$base" 8) &&
    cmp -s -n $((8 * MiB)) -i $((24 * MiB)):0 "$W/random" <(read_mib $((base + 24 * MiB)) 8)
}
