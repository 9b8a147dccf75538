# bench/lib.sh — shared by bench/nbd.sh and bench/report.sh (sourced, not run).
#
# Before sourcing set SQ_PROG (name used in messages). Provides:
#   sq_log MSG / sq_die MSG      progress and errors on stderr
#   sq_need_tools                check (and as root, apt-get install) what ../shared/bench/run.sh needs
#   sq_build                     build the release binary in $CARGO_TARGET_DIR (default target/), set BIN
#   sq_machine FILE              machine facts (CPU, cores, RAM, kernel, filesystem, commit) as "key: value"
#   sq_run_pass OUT NAME PEERS [SERVE ARGS...]
#                                one run of the harness with `squeeze serve` as its custom peer
# The harness is $HARNESS (default ../shared/bench/run.sh); every run.sh setting in the
# environment (REPS, FIO_SIZE, FIO_RT_SEQ, FIO_RT_RAND, TAR, ...) passes through to it.
# shellcheck shell=bash

SQ_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HARNESS=${HARNESS:-$SQ_ROOT/../shared/bench/run.sh}
SQ_PROG=${SQ_PROG:-bench}

sq_log() { printf '[%(%H:%M:%S)T] %s: %s\n' -1 "$SQ_PROG" "$*" >&2; }
sq_die() { sq_log "ERROR: $*"; exit 1; }

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
  command -v cargo >/dev/null || sq_die "no cargo (install Rust with rustup)"
  [[ -x $HARNESS ]] || sq_die "no harness at $HARNESS (set HARNESS)"
}

sq_build() {
  local target=${CARGO_TARGET_DIR:-$SQ_ROOT/target}
  sq_log "building the release binary in $target"
  (cd "$SQ_ROOT" && CARGO_TARGET_DIR=$target cargo build --release --quiet --bin squeeze) \
    || sq_die "cargo build failed"
  BIN=$target/release/squeeze
  [[ -x $BIN ]] || sq_die "no binary at $BIN"
  export BIN
}

sq_bin() { # BIN if the caller set it (an executable, exported), else sq_build's
  if [[ -n ${BIN:-} ]]; then
    [[ -x $BIN ]] || sq_die "BIN=$BIN is not an executable"
    export BIN
  else
    sq_build
  fi
}

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
    echo "squeeze: $("$BIN" --version 2>/dev/null || echo '?')"
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
  PEERS=$peers \
  PEER_CUSTOM_NAME=$name \
  PEER_CUSTOM_CMD="exec \"\$BIN\" serve --socket \"\$PEER_SOCK\" --size 64G $args \"\$PEER_DIR/vol.sqz\"" \
  OUT=$out \
    "$HARNESS" >"$out.stdout"
}
