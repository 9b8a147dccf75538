#!/usr/bin/env bash
# bench/nbd_tester.sh — the NBD project's own test client (nbd-tester-client, from
# NetworkBlockDevice/nbd's tests/run) against `squeeze serve`.
#
#   NBD_SRC=<nbd checkout> bench/nbd_tester.sh     # first run: builds nbd-tester-client
#   bench/nbd_tester.sh [--bin PATH]               # later runs reuse the build
#
# nbd-tester-client is not packaged by Debian, so it is built from an nbd source tree
# (autogen.sh, configure, `make -C tests/run nbd-tester-client`) into $NBD_TESTER_CACHE
# (default /var/tmp/squeeze-nbd-tester), outside this repository; the build needs autoconf,
# automake, libtool, autoconf-archive, pkg-config, bison, flex, libglib2.0-dev and
# libgnutls28-dev (installed with apt-get when run as root). None of its code is ours.
#
# Each case runs as nbd's own tests/run/simple_test runs it: a fresh export (here a new
# squeeze volume file, created by `squeeze serve --size`), one server, one client command,
# then the server is stopped (SIGTERM) and the volume checked offline (`squeeze check`):
#   read        read throughput over the whole export (4 MiB)
#   write       write throughput (-w)
#   flush       writes with flushes (-w -f)
#   integrity   the integrity test's transaction log (-i -t integrity-test.tr: 50 MiB, reads
#               and writes in flight together, every read checked against what was written)
#   handshake   the handshake test (-h)
#   tcp         integrity over TCP on 127.0.0.1 (the others use a unix socket)
#   tls         integrity over TLS with the suite's certificates (server cert signed by its
#               CA, client certificate required: --tls-client-ca)
#   huge        integrityhuge (-i -t integrityhuge-test.tr): 33-49 MB requests from a client
#               that negotiated no block sizes. EXPECTED TO FAIL: squeeze answers requests over
#               its 32 MiB maximum with EINVAL, as qemu-nbd does (README, "Request sizes"); the
#               case passes when the client reports an error reply ("Server errored a
#               transaction": it does not print the errno) and the same server then
#               completes the handshake test on a new connection.
#
# Options: --bin PATH (squeeze binary; default: $BIN, else build target/release/squeeze), --work
# DIR (volumes and logs; default: a new directory under /var/tmp, kept), --cases "read write ..."
# (default: all). Env: OUT (results/nbd_tester-<time>), BENCH_LOCK (/tmp/bench.lock): the whole
# run holds the bench lock (bench/README.md).
# Output: a line per case on stdout and in OUT/results.jsonl, OUT/table.md, OUT/machine.txt.
# Exit status 1 if any case does not end as stated above; its server log is kept.
set -euo pipefail
SQ_PROG=nbd_tester
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

CACHE=${NBD_TESTER_CACHE:-/var/tmp/squeeze-nbd-tester}
WORK=""
CASES="read write flush integrity handshake tcp tls huge"
while (($#)); do
  case $1 in
    --bin) BIN=$2; export BIN; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --cases) CASES=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) sq_die "unknown option $1 (see --help)" ;;
  esac
done

build_tester() {
  [[ -x $CACHE/nbd-tester-client && -f $CACHE/integrity-test.tr ]] && return
  local src=${NBD_SRC:-}
  [[ -n $src && -f $src/tests/run/nbd-tester-client.c ]] || sq_die "nbd-tester-client is not built yet in $CACHE and NBD_SRC is unset.
  nbd is not part of this repository; point NBD_SRC at a checkout of
  https://github.com/NetworkBlockDevice/nbd (the directory holding tests/run/nbd-tester-client.c)."
  local t pkgs=()
  for t in autoreconf:autoconf automake:automake libtoolize:libtool pkg-config:pkg-config \
           bison:bison flex:flex; do
    command -v "${t%%:*}" >/dev/null 2>&1 || pkgs+=("${t##*:}")
  done
  pkg-config --exists glib-2.0 2>/dev/null || pkgs+=(libglib2.0-dev)
  pkg-config --exists gnutls 2>/dev/null || pkgs+=(libgnutls28-dev)
  compgen -G '/usr/share/aclocal/ax_*.m4' >/dev/null || pkgs+=(autoconf-archive)
  if ((${#pkgs[@]})); then
    ((EUID == 0)) || sq_die "building nbd-tester-client needs: apt-get install -y ${pkgs[*]}"
    sq_log "installing ${pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null \
      || sq_die "apt-get install ${pkgs[*]} failed"
  fi
  local b
  b=$(mktemp -d /var/tmp/nbd-build.XXXXXX)
  sq_log "building nbd-tester-client from $src in $b (log: $b.log)"
  cp -a "$src/." "$b/"
  (cd "$b" && ./autogen.sh && ./configure --disable-manpages && make -j"$(nproc)" \
     && make -C tests/run nbd-tester-client) >"$b.log" 2>&1 \
    || sq_die "building nbd-tester-client failed; see $b.log"
  mkdir -p "$CACHE"
  cp "$b/tests/run/nbd-tester-client" "$b"/tests/run/*.tr "$CACHE/"
  cp -a "$b/tests/run/certs" "$CACHE/"
  (cd "$b" && git rev-parse HEAD 2>/dev/null || echo "unknown (not a git checkout)") >"$CACHE/SOURCE"
  rm -rf "$b"
}

sq_lock
build_tester
sq_bin
[[ -n $WORK ]] || WORK=$(mktemp -d /var/tmp/squeeze-nbd-tester.XXXXXX)
mkdir -p "$WORK"
sq_out nbd_tester "$WORK"
T=$CACHE/nbd-tester-client
C=$CACHE/certs

# start NAME SIZE [serve args...]: a fresh volume DIR/NAME/export1.sqz, served on a unix
# socket DIR/NAME/nbd.sock; waits for the server to listen there.
start() {
  local name=$1 size=$2; shift 2
  local d=$WORK/$name
  rm -rf "$d"; mkdir -p "$d"
  sq_serve_start "$name" "$d/server.log" --ready "$d/nbd.sock" -- \
    --socket "$d/nbd.sock" --size "$size" "$@" "$d/export1.sqz"
}

# stop NAME: SIGTERM, wait, then `squeeze check` of the volume.
stop() {
  local d=$WORK/$1
  sq_serve_stop "$1"
  ((SQ_SERVE_RC == 0)) || sq_die "$1: the server exited with an error (status $SQ_SERVE_RC); see $d/server.log"
  "$BIN" check "$d/export1.sqz" >"$d/check.log" 2>&1 || sq_die "$1: squeeze check failed; see $d/check.log"
}

# run NAME EXPECT -- CLIENT ARGS: EXPECT ok (exit 0) or fail (a non-zero exit).
declare -A RESULT EXPECT RC SECS MSG
run() {
  local name=$1 expect=$2; shift 3
  local d=$WORK/$name t0 rc=0
  t0=$(date +%s.%N)
  timeout 600 "$T" "$@" >"$d/client.log" 2>&1 || rc=$?
  local secs
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  local msg
  msg=$(grep -aoE "(complete\. Took [^,]*, [0-9.]+[A-Za-z/]+|Handshake test completed[^.]*|Could not run test: .*)" "$d/client.log" | tail -1 || true)
  EXPECT[$name]=$expect RC[$name]=$rc SECS[$name]=$secs MSG[$name]=$msg
  if [[ $expect == ok && $rc -eq 0 ]] || [[ $expect == fail && $rc -ne 0 && $rc -ne 124 ]]; then
    RESULT[$name]="passed (exit $rc, ${secs} s): ${msg:-no message}"
  else
    RESULT[$name]="FAILED (exit $rc, expected $expect, ${secs} s): ${msg:-no message}; see $d"
  fi
  sq_log "$name: ${RESULT[$name]}"
}

failed=0
# shellcheck disable=SC2162 # "read" below is a case's name passed to run, not the builtin
for c in $CASES; do
  case $c in
    read) start read 4M; run read ok -- -u "$WORK/read/nbd.sock" -N export1; stop read ;;
    write) start write 4M; run write ok -- -u "$WORK/write/nbd.sock" -N export1 -w; stop write ;;
    flush) start flush 4M; run flush ok -- -u "$WORK/flush/nbd.sock" -N export1 -w -f; stop flush ;;
    integrity)
      start integrity 50M
      run integrity ok -- -u "$WORK/integrity/nbd.sock" -N export1 -i -t "$CACHE/integrity-test.tr"
      stop integrity ;;
    handshake) start handshake 4M; run handshake ok -- -u "$WORK/handshake/nbd.sock" -h -N export1; stop handshake ;;
    tcp)
      port=$((20000 + RANDOM % 20000))
      start tcp 50M --listen "127.0.0.1:$port"
      run tcp ok -- 127.0.0.1 -N export1 "$port" -i -t "$CACHE/integrity-test.tr"
      stop tcp ;;
    tls)
      start tls 50M --tls-cert "$C/server-cert.pem" --tls-key "$C/server-key.pem" --tls-client-ca "$C/ca-cert.pem"
      run tls ok -- -u "$WORK/tls/nbd.sock" -N export1 -i -t "$CACHE/integrity-test.tr" \
        -C "$C/client-cert.pem" -K "$C/client-key.pem" -A "$C/ca-cert.pem" -H localhost
      stop tls ;;
    huge)
      start huge 50M
      run huge fail -- -u "$WORK/huge/nbd.sock" -N export1 -i -t "$CACHE/integrityhuge-test.tr"
      # The client does not print the error number; an error reply (not a dropped
      # connection or a data mismatch) is what it reports as "Server errored a transaction".
      if [[ ${RESULT[huge]} == passed* ]] && ! grep -aq "Server errored a transaction" "$WORK/huge/client.log"; then
        RESULT[huge]="FAILED: the client failed, but not on an error reply; see $WORK/huge/client.log"
      fi
      mkdir -p "$WORK/huge-after"
      if [[ ${RESULT[huge]} == passed* ]]; then
        timeout 60 "$T" -u "$WORK/huge/nbd.sock" -h -N export1 >"$WORK/huge-after/client.log" 2>&1 \
          || RESULT[huge]="FAILED: the server did not serve the next connection; see $WORK/huge-after"
      fi
      stop huge ;;
    *) sq_die "unknown case $c" ;;
  esac
done

echo
echo "nbd-tester-client ($(cat "$CACHE/SOURCE" 2>/dev/null || echo "source unknown")) against $("$BIN" --version 2>/dev/null || echo "$BIN"):"
for c in $CASES; do
  printf '  %-10s %s\n' "$c" "${RESULT[$c]}"
  passed=true
  [[ ${RESULT[$c]} == passed* ]] || { failed=1; passed=false; }
  sq_result case="$c" passed:="$passed" expected="${EXPECT[$c]}" exit="${RC[$c]}" seconds="${SECS[$c]}" \
    client_said="${MSG[$c]}" result="${RESULT[$c]}" dir="$WORK/$c"
done
sq_table
echo "work directory: $WORK"
echo "results: $OUT"
exit "$failed"
