#!/usr/bin/env bash
# Boot the test guest (scripts/guest/build.sh builds it first if it is missing
# or stale) and run one test script in it, as root.
#
#   scripts/guest/run.sh BINARY TESTSCRIPT [OUTDIR]
#
# BINARY (squeeze's release binary) and TESTSCRIPT go in as a tar on a
# read-only disk, unpacked into /mnt/in; in the guest the binary is /usr/local/bin/squeeze ($SQUEEZE_BIN)
# and the script runs under bash with $GUEST_OUT (a read-write 9p share, which
# is OUTDIR here) for files it wants to bring out. OUTDIR (default: a new
# directory under ${TMPDIR:-/tmp}) gets console.log (the serial console: the
# kernel, /init and the test's output), test.log (the test's output), dmesg.log
# and status. The exit status is the test script's; 124 when the guest ran
# out of time (it is killed), 125 when it could not run the test.
#
# Environment:
#   SQUEEZE_GUEST_TIMEOUT  seconds before the guest is killed (default 900)
#   SQUEEZE_GUEST_CPUS, SQUEEZE_GUEST_MEM   vCPUs and RAM (default 2 and 2G)
#   SQUEEZE_GUEST_ACCEL    tcg (default) or kvm
#   SQUEEZE_GUEST_QUIET=1  do not stream the console while the guest runs
#   SQUEEZE_TEST_*         passed into the guest's environment
#   SQUEEZE_GUEST_LOCK     held while the guest runs (see build.sh)
#   and build.sh's SQUEEZE_GUEST_CACHE, SQUEEZE_GUEST_MIRROR, SQUEEZE_GUEST_KERNEL.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${SQUEEZE_GUEST_CACHE:-${HOME:-/root}/.cache/squeeze-guest}
TIMEOUT=${SQUEEZE_GUEST_TIMEOUT:-900}
CPUS=${SQUEEZE_GUEST_CPUS:-2}
MEM=${SQUEEZE_GUEST_MEM:-2G}
ACCEL=${SQUEEZE_GUEST_ACCEL:-tcg}

log() { printf '[%(%H:%M:%S)T] guest-run: %s\n' -1 "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 125
}

(($# >= 2 && $# <= 3)) || {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}
BINARY=$1
TEST=$2
[[ -x $BINARY && -f $BINARY ]] || die "BINARY $BINARY is not an executable file"
[[ -f $TEST ]] || die "TESTSCRIPT $TEST is not a file"
if (($# == 3)); then
  OUT=$3
  mkdir -p "$OUT"
else
  OUT=$(mktemp -d "${TMPDIR:-/tmp}/squeeze-guest.XXXXXX")
fi
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT/status" "$OUT/console.log" "$OUT/test.log" "$OUT/dmesg.log"

t0=$SECONDS
"$HERE/build.sh" --check >/dev/null 2>&1 || "$HERE/build.sh" || die "the guest could not be built (above)"
t_build=$((SECONDS - t0))

# The binary must find its libraries in the guest's root (it runs there as it is).
missing=$(ldd "$BINARY" 2>/dev/null | awk '$2 == "=>" { print $1 }' | while read -r lib; do
  grep -qxF "$lib" "$CACHE/root.libs" || echo "$lib"
done)
[[ -z $missing ]] || die "$BINARY needs $(echo "$missing" | tr '\n' ' ')which the guest's root lacks: add the Debian package that ships it to GUEST_PACKAGES in scripts/guest/build.sh"

# The inputs, as a tar on the guest's second disk (serial sqin).
IN=$(mktemp -d "${TMPDIR:-/tmp}/squeeze-guest-in.XXXXXX")
QEMU_PID=
TAIL_PID=
# shellcheck disable=SC2317 # called by the trap
cleanup() {
  if [[ -n $TAIL_PID ]]; then kill "$TAIL_PID" 2>/dev/null; fi
  if [[ -n $QEMU_PID ]] && kill -0 "$QEMU_PID" 2>/dev/null; then
    kill "$QEMU_PID" 2>/dev/null
  fi
  rm -rf "$IN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir "$IN/d"
ln -s "$(realpath "$BINARY")" "$IN/d/squeeze"
ln -s "$(realpath "$TEST")" "$IN/d/test"
# What the tests share (tests/guest/lib/), beside the test as in the tree.
if [[ -d $(dirname "$TEST")/lib ]]; then
  ln -s "$(realpath "$(dirname "$TEST")/lib")" "$IN/d/lib"
fi
basename "$TEST" >"$IN/d/test.name"
env | grep -E '^SQUEEZE_TEST_[A-Za-z0-9_]*=' | sed "s/'/'\\\\''/g; s/=/='/; s/\$/'/" >"$IN/d/env" || true
tar -chf "$IN/in.tar" -C "$IN/d" .

case $ACCEL in
  tcg) ACCEL_OPTS=(-accel "tcg,thread=multi,tb-size=256" -cpu max) ;;
  kvm) ACCEL_OPTS=(-accel kvm -cpu host) ;;
  *) die "SQUEEZE_GUEST_ACCEL=$ACCEL: tcg or kvm" ;;
esac
QEMU=(qemu-system-x86_64 -machine q35 "${ACCEL_OPTS[@]}" -smp "$CPUS" -m "$MEM"
  -nodefaults -no-user-config -display none -monitor none -no-reboot
  -serial "file:$OUT/console.log"
  -kernel "$CACHE/kernel/vmlinuz" -initrd "$CACHE/initrd.gz"
  -append "console=ttyS0 panic=-1 loglevel=4 rootwait mitigations=off"
  -drive "if=none,id=root,file=$CACHE/root.img,format=raw,snapshot=on,cache=unsafe,discard=unmap"
  -device "virtio-blk-pci,drive=root,serial=sqroot"
  -drive "if=none,id=in,file=$IN/in.tar,format=raw,readonly=on"
  -device "virtio-blk-pci,drive=in,serial=sqin"
  -virtfs "local,path=$OUT,mount_tag=sqout,security_model=none"
  -device virtio-rng-pci)

if [[ -n ${SQUEEZE_GUEST_LOCK:-} ]]; then
  exec 9>>"$SQUEEZE_GUEST_LOCK"
  log "waiting for $SQUEEZE_GUEST_LOCK"
  flock 9
fi
log "booting: $ACCEL, $CPUS vCPUs, $MEM, kernel $(cat "$CACHE/kernel/package"), timeout ${TIMEOUT} s, out $OUT"
t1=$SECONDS
: >"$OUT/console.log"
"${QEMU[@]}" 9>&- </dev/null >"$OUT/qemu.log" 2>&1 &
QEMU_PID=$!
if [[ ${SQUEEZE_GUEST_QUIET:-0} != 1 ]]; then
  tail -n +1 -f "$OUT/console.log" --pid="$QEMU_PID" 9>&- &
  TAIL_PID=$!
fi
timed_out=0
while kill -0 "$QEMU_PID" 2>/dev/null; do
  if ((SECONDS - t1 >= TIMEOUT)); then
    timed_out=1
    log "TIMEOUT: the guest ran ${TIMEOUT} s; killing qemu (pid $QEMU_PID)"
    kill "$QEMU_PID" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      kill -0 "$QEMU_PID" 2>/dev/null || break
      sleep 1
    done
    kill -9 "$QEMU_PID" 2>/dev/null || true
    break
  fi
  sleep 1
done
qemu_rc=0
wait "$QEMU_PID" || qemu_rc=$?
QEMU_PID=
if [[ -n $TAIL_PID ]]; then
  wait "$TAIL_PID" 2>/dev/null || true
  TAIL_PID=
fi
t_guest=$((SECONDS - t1))
[[ -s $OUT/qemu.log ]] && sed 's/^/qemu: /' "$OUT/qemu.log" >&2

if ((timed_out)); then
  rc=124
elif [[ -s $OUT/status ]]; then
  rc=$(cat "$OUT/status")
  [[ $rc =~ ^[0-9]+$ ]] || rc=125
else
  log "the guest stopped without a status (qemu exited $qemu_rc): see $OUT/console.log"
  rc=125
fi
log "guest $t_guest s (build check $t_build s); test $(basename "$TEST") exited $rc; logs in $OUT"
exit "$rc"
