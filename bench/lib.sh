# bench/lib.sh — shared by every bench/ harness (sourced, not run). bench/README.md says how to
# run one.
#
# One way to run a benchmark. Every harness, in this order:
#   1. reads its settings and checks its tools (failing early takes no lock)
#   2. sq_lock                 takes the bench lock ($BENCH_LOCK, default /tmp/bench.lock) for the
#                              whole run; a harness started by one that holds it (SQ_LOCKED=1 in
#                              the environment, set by sq_lock) or under `flock /tmp/bench.lock ...`
#                              goes on without waiting
#   3. sq_bin                  the squeeze binary: $BIN if set, else the release build of this
#                              checkout (sq_build: cargo build --release in $CARGO_TARGET_DIR,
#                              default target/), built once per run (BIN is exported to children)
#   4. sq_out NAME [SCRATCH]   the output directory: $OUT if set, else $SQ_RESULTS/NAME-<time>
#                              (SQ_RESULTS default results/ in this checkout); made, with
#                              machine.txt (sq_machine; SCRATCH names the file system measured)
#   5. measures, starting and stopping `squeeze serve` with sq_serve_start / sq_serve_stop, and
#      writes every result as one JSON line of OUT/results.jsonl (sq_result, or sq_emit)
#   6. sq_table                OUT/table.md: the harness's own markdown, or a table of
#                              results.jsonl (bench/results.py table)
# Scratch space (volumes, mounts, loop devices' files) is not OUT: each harness keeps it where its
# header says (under /tmp or /var/tmp) and removes it at exit.
#
# Before sourcing set SQ_PROG (name used in messages). Provides:
#   sq_log MSG / sq_die MSG      progress and errors on stderr
#   sq_on_exit FUNC              run FUNC at exit (last registered first), before the servers still
#                                running are stopped; lib.sh owns the EXIT trap (INT and TERM exit
#                                130 and 143 through it): harnesses use this, not `trap ... EXIT`
#   sq_lock                      hold the bench lock until the process exits (see above)
#   sq_build / sq_bin            build the release binary and set BIN / BIN if set, else sq_build
#   sq_cargo_build ARGS...       cargo build --release --quiet ARGS in this checkout ($CARGO_TARGET_DIR)
#   sq_out NAME [SCRATCH]        set and make OUT, write OUT/machine.txt, empty OUT/results.jsonl
#   sq_result KEY=VALUE...       append one JSON object to OUT/results.jsonl (VALUE a number when it
#                                reads as one, else a string; KEY:=JSON for true, null, lists, ...)
#   sq_result - [KEY=VALUE...]   append the JSON objects on stdin (one a line), KEY=VALUE on each
#   sq_emit [KEY=VALUE...]       stdin: lines that are JSON objects to OUT/results.jsonl, the other
#                                lines to stdout (a harness's Python prints both)
#   sq_table                     OUT/table.md from OUT/results.jsonl (one table per set of keys)
#   sq_table -                   OUT/table.md from stdin, copied to stdout
#   sq_serve_start NAME LOG [--ready PATH]... [--timeout S] -- SERVE ARGS...
#                                `$BIN serve SERVE ARGS` in the background, stdout and stderr
#                                appended to LOG; returns once the server has printed
#                                "squeeze serve: listening on" (its sockets, control socket and
#                                FUSE export are then up) and every PATH exists; dies if it exits
#                                first or takes more than S (60) seconds. The server does not
#                                inherit the lock. Environment assignments before the call reach
#                                the server (RUST_LOG=... sq_serve_start ...; BIN=... too)
#   sq_serve_pid NAME            its PID
#   sq_serve_stop NAME [SIGNAL]  send SIGNAL (TERM) and wait; its exit status in SQ_SERVE_RC
#                                (always returns 0). At exit every server still running gets
#                                SIGTERM, and SIGKILL after SQ_SERVE_STOP_SECS (30)
#   sq_need_tools                check (and as root, apt-get install) what ../shared/bench/run.sh needs
#   sq_machine FILE [SCRATCH]    machine facts (CPU, cores, RAM, kernel, filesystem, commit) as "key: value"
#   sq_run_pass OUT NAME PEERS [SERVE ARGS...]
#                                one run of the shared harness with `squeeze serve` as its custom
#                                peer (the harness starts that server itself: it measures its CPU)
# The harness is $HARNESS (default ../shared/bench/run.sh); every run.sh setting in the
# environment (REPS, FIO_SIZE, FIO_RT_SEQ, FIO_RT_RAND, TAR, ...) passes through to it.
# shellcheck shell=bash

SQ_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HARNESS=${HARNESS:-$SQ_ROOT/../shared/bench/run.sh}
SQ_PROG=${SQ_PROG:-bench}
SQ_LOCK=${BENCH_LOCK:-/tmp/bench.lock}
SQ_RESULTS=${SQ_RESULTS:-$SQ_ROOT/results}
SQ_RESULTS_PY=$SQ_ROOT/bench/results.py

sq_log() { printf '[%(%H:%M:%S)T] %s: %s\n' -1 "$SQ_PROG" "$*" >&2; }
# (inside the exit hooks an error is logged and the hook goes on: the servers must still stop)
sq_die() { sq_log "ERROR: $*"; [[ -z ${SQ_EXITING:-} ]] || return 1; exit 1; }

# ---------------------------------------------------------------- exit: hooks, then servers
SQ_EXIT_HOOKS=()
SQ_OUT_MADE=0
sq_on_exit() { SQ_EXIT_HOOKS+=("$1"); }

sq_exit() {
  local rc=$? i
  set +e
  SQ_EXITING=1
  for ((i = ${#SQ_EXIT_HOOKS[@]} - 1; i >= 0; i--)); do "${SQ_EXIT_HOOKS[i]}"; done
  sq_serve_stop_all
  # A run that ended early still leaves a table of what it measured.
  if ((SQ_OUT_MADE)) && [[ ! -e $OUT/table.md ]]; then
    {
      echo "_The run ended early (exit status $rc); the results it wrote:_"
      echo
      python3 "$SQ_RESULTS_PY" table "$OUT/results.jsonl"
    } >"$OUT/table.md" 2>/dev/null
  fi
  exit "$rc"
}
trap sq_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- the bench lock
# Held on a file descriptor of this shell until it exits: opened read-only (as flock(1) does, so
# a lock file made by another user works) and never passed to `squeeze serve` (sq_serve_start
# closes it there). Other processes this shell starts inherit it, so it stays held until the last
# of them exits.
sq_lock_holders() { # PIDs that hold a lock on $SQ_LOCK (/proc/locks; waiters are not listed)
  local st maj min
  st=$(stat -Lc '%i %Hd %Ld' "$SQ_LOCK" 2>/dev/null) || return 0
  read -r st maj min <<<"$st"
  awk -v id="$(printf '%02x:%02x:%s' "$maj" "$min" "$st")" '$2 != "->" && $6 == id { print $5 }' /proc/locks
}

sq_ancestor() { # sq_ancestor PID: true if PID is this shell or one of its ancestors
  local p=$$ s
  while ((p > 1)); do
    [[ $p == "$1" ]] && return 0
    s=$(cat "/proc/$p/stat" 2>/dev/null) || return 1
    s=${s##*) }
    read -r _ p _ <<<"$s"
  done
  return 1
}

sq_lock() {
  local p c holders=() who=() t0
  [[ -z ${SQ_LOCK_FD:-} ]] || return 0
  [[ -e $SQ_LOCK ]] || : >>"$SQ_LOCK" || sq_die "cannot create $SQ_LOCK"
  exec {SQ_LOCK_FD}<"$SQ_LOCK" || sq_die "cannot open $SQ_LOCK"
  if flock -n "$SQ_LOCK_FD"; then
    [[ ${SQ_LOCKED:-0} != 1 ]] || sq_log "SQ_LOCKED=1, but nobody held $SQ_LOCK: holding it now"
  else
    mapfile -t holders < <(sq_lock_holders)
    for p in "${holders[@]}"; do
      if sq_ancestor "$p"; then SQ_LOCKED=1; fi
    done
    if [[ ${SQ_LOCKED:-0} == 1 ]]; then
      # The caller holds it (SQ_LOCKED=1 from a harness's sq_lock, or `flock LOCK harness`).
      exec {SQ_LOCK_FD}<&-
      SQ_LOCK_FD=held-by-caller
      sq_log "$SQ_LOCK is held by the caller; going on"
    else
      for p in "${holders[@]}"; do
        c=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-100) || c=""
        who+=("pid $p${c:+: $c}")
      done
      t0=$SECONDS
      sq_log "waiting for $SQ_LOCK${who[*]:+ (held by ${who[*]})}"
      flock "$SQ_LOCK_FD" || sq_die "flock $SQ_LOCK failed"
      sq_log "holding $SQ_LOCK (waited $((SECONDS - t0)) s)"
    fi
  fi
  export SQ_LOCKED=1
}

# command:package pairs for everything run.sh calls
SQ_TOOLS="fio:fio qemu-nbd:qemu-utils qemu-img:qemu-utils nbdcopy:libnbd-bin nbdinfo:libnbd-bin
  mkfs.btrfs:btrfs-progs btrfs:btrfs-progs compsize:btrfs-compsize /usr/bin/time:time
  flock:util-linux losetup:mount python3:python3 numfmt:coreutils"

sq_need_tools() {
  local t pkgs=()
  for t in $SQ_TOOLS; do
    command -v "${t%%:*}" >/dev/null 2>&1 || pkgs+=("${t##*:}")
  done
  if ((${#pkgs[@]})); then
    mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
    if [[ $(id -u) == 0 && ${INSTALL:-1} != 0 ]] && command -v apt-get >/dev/null; then
      sq_log "installing ${pkgs[*]} (apt-get; INSTALL=0 to refuse)"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >&2 \
        || sq_die "apt-get install failed; run: apt-get update && apt-get install -y ${pkgs[*]}"
    else
      sq_die "missing tools; run: apt-get update && apt-get install -y ${pkgs[*]}"
    fi
  fi
  [[ -n ${BIN:-} ]] || command -v cargo >/dev/null || sq_die "no cargo (install Rust with rustup), and BIN is not set"
  [[ -x $HARNESS ]] || sq_die "no harness at $HARNESS (set HARNESS)"
}

# ---------------------------------------------------------------- the binary
SQ_TARGET=${CARGO_TARGET_DIR:-$SQ_ROOT/target}

sq_cargo_build() { # sq_cargo_build ARGS...: a release build in this checkout, into $SQ_TARGET
  command -v cargo >/dev/null || sq_die "no cargo (install Rust with rustup), and BIN is not set"
  (cd "$SQ_ROOT" && CARGO_TARGET_DIR=$SQ_TARGET cargo build --release --quiet "$@") \
    || sq_die "cargo build --release $* failed"
}

sq_build() {
  sq_log "building the release binary in $SQ_TARGET"
  sq_cargo_build --bin squeeze
  BIN=$SQ_TARGET/release/squeeze
  [[ -x $BIN ]] || sq_die "no binary at $BIN"
  export BIN
}

sq_bin() { # BIN if the caller set it (an executable, exported), else sq_build's
  if [[ -n ${BIN:-} ]]; then
    [[ -x $BIN ]] || sq_die "BIN=$BIN is not an executable"
    BIN=$(readlink -f "$BIN")
    export BIN
    sq_log "using $BIN"
  else
    sq_build
  fi
}

# ---------------------------------------------------------------- results
sq_out() { # sq_out NAME [SCRATCH]: OUT ($OUT, or $SQ_RESULTS/NAME-<time>), machine.txt
  local name=$1 scratch=${2:-}
  OUT=${OUT:-$SQ_RESULTS/$name-$(date +%Y%m%d-%H%M%S)}
  mkdir -p "$OUT" || sq_die "cannot make $OUT"
  OUT=$(readlink -f "$OUT")
  [[ ! -s $OUT/results.jsonl ]] || sq_log "$OUT has results of an earlier run: results.jsonl and table.md start afresh"
  : >"$OUT/results.jsonl"
  rm -f "$OUT/table.md"
  SQ_OUT_MADE=1
  sq_machine "$OUT/machine.txt" "${scratch:-$OUT}"
  sq_log "results in $OUT"
}

sq_result() { # sq_result KEY=VALUE... | sq_result - [KEY=VALUE...] < JSON lines
  ((SQ_OUT_MADE)) || sq_die "sq_result before sq_out"
  python3 "$SQ_RESULTS_PY" add "$OUT/results.jsonl" "$@" || sq_die "could not add to $OUT/results.jsonl"
}

# shellcheck disable=SC2120 # the arguments are optional
sq_emit() { # stdin: JSON-object lines to OUT/results.jsonl (with KEY=VALUE...), other lines to stdout
  local line json=()
  while IFS= read -r line || [[ -n $line ]]; do
    if [[ $line == '{'* ]]; then json+=("$line"); else printf '%s\n' "$line"; fi
  done
  ((${#json[@]} == 0)) || printf '%s\n' "${json[@]}" | sq_result - "$@"
}

# shellcheck disable=SC2120 # the argument is optional
sq_table() { # sq_table: from results.jsonl; sq_table -: stdin, copied to stdout
  ((SQ_OUT_MADE)) || [[ -n ${OUT:-} && -d ${OUT:-} ]] || sq_die "sq_table before sq_out"
  if [[ ${1:-} == - ]]; then
    tee "$OUT/table.md.tmp" || sq_die "could not write $OUT/table.md"
  else
    python3 "$SQ_RESULTS_PY" table "$OUT/results.jsonl" >"$OUT/table.md.tmp" \
      || sq_die "could not make a table of $OUT/results.jsonl"
  fi
  mv "$OUT/table.md.tmp" "$OUT/table.md"
}

# ---------------------------------------------------------------- squeeze serve
declare -gA SQ_SERVE_PID=()
# shellcheck disable=SC2034 # read by the harnesses
SQ_SERVE_RC=0

sq_serve_start() { # sq_serve_start NAME LOG [--ready PATH]... [--timeout S] -- SERVE ARGS...
  local name=$1 log=$2 timeout=60 ready=() from i p pid rc ok
  shift 2
  while (($#)); do
    case $1 in
      --ready) ready+=("$2"); shift 2 ;;
      --timeout) timeout=$2; shift 2 ;;
      --) shift; break ;;
      *) sq_die "sq_serve_start: unknown option $1" ;;
    esac
  done
  [[ -z ${SQ_SERVE_PID[$name]:-} ]] || sq_die "sq_serve_start: $name runs already (pid ${SQ_SERVE_PID[$name]})"
  [[ -x ${BIN:-} ]] || sq_die "sq_serve_start: no squeeze binary (BIN; sq_bin first)"
  mkdir -p "$(dirname "$log")"
  from=$(($(stat -c %s "$log" 2>/dev/null || echo 0) + 1)) # a restart appends: only its own lines count
  if [[ ${SQ_LOCK_FD:-} == [0-9]* ]]; then
    "$BIN" serve "$@" >>"$log" 2>&1 {SQ_LOCK_FD}<&- &
  else
    "$BIN" serve "$@" >>"$log" 2>&1 &
  fi
  pid=$!
  SQ_SERVE_PID[$name]=$pid
  sq_log "$name: squeeze serve $* (pid $pid, log $log)"
  for ((i = 0; i < timeout * 10; i++)); do
    if tail -c "+$from" "$log" 2>/dev/null | grep -q 'squeeze serve: listening on'; then
      ok=1
      for p in "${ready[@]}"; do [[ -e $p ]] || ok=0; done
      ((ok)) && return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      rc=0
      wait "$pid" 2>/dev/null || rc=$?
      unset 'SQ_SERVE_PID[$name]'
      sq_die "$name: squeeze serve exited (status $rc) before it was up: $(tail -c "+$from" "$log" | tail -n 5)"
    fi
    sleep 0.1
  done
  sq_die "$name: squeeze serve not up after ${timeout}s (waiting for its \"listening on\"${ready[*]:+ and ${ready[*]}}; log $log)"
}

sq_serve_pid() { echo "${SQ_SERVE_PID[$1]:-}"; }

sq_serve_stop() { # sq_serve_stop NAME [SIGNAL]: signal it (TERM) and wait; status in SQ_SERVE_RC
  local name=$1 sig=${2:-TERM} pid
  SQ_SERVE_RC=0
  pid=${SQ_SERVE_PID[$name]:-}
  [[ -n $pid ]] || return 0
  unset 'SQ_SERVE_PID[$name]'
  kill -s "$sig" "$pid" 2>/dev/null || true
  # shellcheck disable=SC2034 # read by the harnesses
  wait "$pid" 2>/dev/null || SQ_SERVE_RC=$?
  return 0
}

sq_serve_stop_all() { # every server still running: SIGTERM, SIGKILL after SQ_SERVE_STOP_SECS
  local name pid i
  for name in "${!SQ_SERVE_PID[@]}"; do
    pid=${SQ_SERVE_PID[$name]}
    sq_log "$name: stopping squeeze serve (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < ${SQ_SERVE_STOP_SECS:-30} * 10; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      sq_log "$name: squeeze serve (pid $pid) still runs ${SQ_SERVE_STOP_SECS:-30} s after SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
    unset 'SQ_SERVE_PID[$name]'
  done
}

# ---------------------------------------------------------------- machine, shared harness

sq_machine() { # sq_machine FILE [SCRATCH_DIR]: machine facts, one "key: value" a line
  local file=$1 scratch=${2:-${SCRATCH_BASE:-/tmp}} dirty=""
  git -C "$SQ_ROOT" diff --quiet HEAD -- crates src Cargo.toml Cargo.lock 2>/dev/null \
    || dirty=" (uncommitted changes in crates/, src/ or Cargo.*)"
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git -C "$SQ_ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$dirty"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -n1)"
    echo "cores: $(nproc)"
    echo "hypervisor: $(lscpu | sed -n 's/^Hypervisor vendor: *//p' | head -n1)"
    echo "l3: $(lscpu | sed -n 's/^L3 cache: *//p' | head -n1)"
    echo "mem: $(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
    echo "kernel: $(uname -r)"
    echo "filesystem: $(findmnt -no FSTYPE,SOURCE -T "$scratch" 2>/dev/null | tr -s ' ') ($scratch)"
    echo "squeeze: $("${BIN:-false}" --version 2>/dev/null || echo '?')"
    echo "rustc: $(rustc --version 2>/dev/null || echo '?')"
  } >"$file"
}

sq_run_pass() { # sq_run_pass OUT NAME PEERS [SERVE ARGS...]
  local out=$1 name=$2 peers=$3 tmp
  shift 3
  local args="$*${SQUEEZE_SERVE_ARGS:+ $SQUEEZE_SERVE_ARGS}"
  mkdir -p "$out"
  # The policy the served volumes get: create one the same way and ask it.
  tmp=$(mktemp -d)
  if ! { "$BIN" create "$tmp/policy.sqz" --size 1G "$@" >/dev/null \
         && "$BIN" info --json "$tmp/policy.sqz" >"$out/policy.json"; }; then
    sq_log "could not record the policy of '$*'"
  fi
  rm -rf "$tmp"
  {
    echo "custom_name: $name"
    echo "peers: $peers"
    echo "serve_args: $args"
  } >"$out/pass.txt"
  sq_log "harness run: PEERS=\"$peers\" (custom peer $name: squeeze serve${args:+ $args}) -> $out"
  # The server creates its volume (64 GiB thin) in the harness's fresh $PEER_DIR and stays in
  # the foreground (exec) so that the harness measures its CPU time.
  # run.sh takes BENCH_LOCK around each timed step. When this process holds the bench lock
  # already (sq_lock), that would wait for ever: run.sh gets a lock file of its own instead,
  # which nobody else takes (the bench lock keeps everyone else out meanwhile).
  local lock=${BENCH_LOCK:-/tmp/bench.lock} rc=0
  if [[ ${SQ_LOCKED:-0} == 1 ]]; then lock=$(mktemp "${TMPDIR:-/tmp}/squeeze-run-lock.XXXXXX"); fi
  PEERS=$peers \
  PEER_CUSTOM_NAME=$name \
  PEER_CUSTOM_CMD="exec \"\$BIN\" serve --socket \"\$PEER_SOCK\" --size 64G $args \"\$PEER_DIR/vol.sqz\"" \
  OUT=$out \
  BENCH_LOCK=$lock \
    "$HARNESS" >"$out.stdout" || rc=$?
  [[ $lock == "${BENCH_LOCK:-/tmp/bench.lock}" ]] || rm -f "$lock"
  return "$rc"
}
