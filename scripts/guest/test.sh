#!/usr/bin/env bash
# The tests that run in the test guest (tests/guest/*.sh), for the test suite
# and CI: builds the release binary and the guest when needed, runs each test
# in a fresh boot (scripts/guest/run.sh), prints a PASS/FAIL line per test and
# a closing "guest: N passed, N failed" line; exits non-zero when one failed.
#
#   bash scripts/guest/test.sh                 # every tests/guest/*.sh
#   bash scripts/guest/test.sh nbd_client      # some of them, by name
#
# Where the guest cannot be built (not root, a host package or the Debian
# mirror out of reach) the tests are SKIPPED with the reason, and exit 0;
# under CI=true that is a failure instead.
#
# Environment: SQUEEZE_GUEST_BIN (the binary to test; default: cargo build
# --release, then target/release/squeeze), SQUEEZE_GUEST_RESULTS (where each
# test's logs go; default target/guest), and those of build.sh and run.sh
# (SQUEEZE_GUEST_CACHE, SQUEEZE_GUEST_LOCK, SQUEEZE_GUEST_TIMEOUT, ...).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
RESULTS=${SQUEEZE_GUEST_RESULTS:-$ROOT/target/guest}

log() { printf '[%(%H:%M:%S)T] guest-test: %s\n' -1 "$*" >&2; }
# cannot REASON: the guest tests cannot run here.
cannot() {
  if [[ ${CI:-} == true ]]; then
    log "FAILED: the guest tests cannot run: $*"
    exit 1
  fi
  log "SKIPPED: the guest tests (tests/guest/*.sh): $*"
  exit 0
}
locked() {
  if [[ -n ${SQUEEZE_GUEST_LOCK:-} ]]; then flock "$SQUEEZE_GUEST_LOCK" "$@"; else "$@"; fi
}

tests=()
if (($#)); then
  for t in "$@"; do
    t=${t%.sh}
    [[ -f $ROOT/tests/guest/${t##*/}.sh ]] || {
      log "no test tests/guest/${t##*/}.sh"
      exit 2
    }
    tests+=("$ROOT/tests/guest/${t##*/}.sh")
  done
else
  tests=("$ROOT"/tests/guest/*.sh)
fi

[[ $(id -u) == 0 ]] || cannot "they need root (debootstrap for the guest's root; nbd and ublk in the guest are root's anyway)"
[[ $(uname -m) == x86_64 ]] || cannot "the guest is x86_64 and this host is $(uname -m)"
"$HERE/build.sh" || cannot "the guest could not be built (above)"

if [[ -n ${SQUEEZE_GUEST_BIN:-} ]]; then
  BIN=$SQUEEZE_GUEST_BIN
else
  log "cargo build --release --bin squeeze"
  (cd "$ROOT" && locked cargo build --release --quiet --bin squeeze)
  BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/squeeze
fi
[[ -x $BIN ]] || {
  log "no binary at $BIN"
  exit 1
}

passed=0
failed=0
t_all=$SECONDS
for t in "${tests[@]}"; do
  name=$(basename "$t" .sh)
  out=$RESULTS/$name
  rm -rf "$out"
  t0=$SECONDS
  rc=0
  SQUEEZE_GUEST_QUIET=${SQUEEZE_GUEST_QUIET:-1} "$HERE/run.sh" "$BIN" "$t" "$out" || rc=$?
  # The test's own PASS/FAIL lines.
  grep -E '^(PASS|FAIL|SKIPPED)' "$out/test.log" 2>/dev/null | sed "s/^/  $name: /" || true
  if ((rc == 0)); then
    passed=$((passed + 1))
    echo "PASS guest/$name ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1))
    echo "FAIL guest/$name: exit $rc ($((SECONDS - t0)) s); logs in $out (console.log, test.log, dmesg.log)"
    tail -n 30 "$out/console.log" 2>/dev/null | sed "s/^/  console: /" || true
  fi
done
log "$((SECONDS - t_all)) s"
echo "guest: $passed passed, $failed failed"
((failed == 0))
