#!/usr/bin/env bash
# Fuzz smoke: builds the cargo-fuzz targets and runs each for
# $FUZZ_SECONDS (default 15) seconds from the committed seed corpus.
# Exits non-zero on any crash, hang or build failure. If cargo-fuzz is
# missing and cannot be installed, prints "SKIPPED: cargo-fuzz unavailable"
# and exits 0 (non-zero when CI=true, so CI cannot silently skip it).
#
# Usage: fuzz/smoke.sh [target...]     (default: all five targets)
# Env:   FUZZ_SECONDS=N                 time per target
#        CARGO_TARGET_DIR=dir           build dir (default fuzz/target)
#        FUZZ_NO_INSTALL=1              do not try `cargo install cargo-fuzz`
#
# New inputs libFuzzer finds go to a scratch corpus under the target dir,
# never into fuzz/corpus/; crash inputs go to <target dir>/fuzz-smoke/
# artifacts/<target>/. See fuzz/README.md for turning one into a test.
set -u -o pipefail

cd "$(dirname "$0")"
FUZZ_DIR=$PWD
SECONDS_PER_TARGET=${FUZZ_SECONDS:-15}
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
    TARGETS=(format_decoders codec_decompress nbd_stream engine_ops volume_damage)
fi

skip() {
    echo "######################################################################"
    echo "SKIPPED: cargo-fuzz unavailable ($1)"
    echo "######################################################################"
    if [ "${CI:-}" = "true" ]; then
        exit 1
    fi
    exit 0
}

if ! cargo fuzz --version >/dev/null 2>&1; then
    if [ "${FUZZ_NO_INSTALL:-}" = "1" ]; then
        skip "not installed and FUZZ_NO_INSTALL=1"
    fi
    echo "smoke: installing cargo-fuzz (cargo install cargo-fuzz --locked)"
    if ! cargo install cargo-fuzz --locked; then
        skip "cargo install cargo-fuzz failed"
    fi
    cargo fuzz --version >/dev/null 2>&1 || skip "cargo fuzz does not run after install"
fi

# cargo-fuzz needs -Z flags (sanitizer, sancov); stable rustc accepts them
# with RUSTC_BOOTSTRAP=1 (harmless on nightly).
export RUSTC_BOOTSTRAP=1
# libdeflate's C sources define the same static tables in several
# translation units; ASan's ODR check reports that as a violation.
export ASAN_OPTIONS="detect_odr_violation=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"

TARGET_DIR=${CARGO_TARGET_DIR:-$FUZZ_DIR/target}
WORK=$TARGET_DIR/fuzz-smoke
mkdir -p "$WORK"

t0=$(date +%s)
echo "smoke: building fuzz targets (target dir $TARGET_DIR)"
if ! cargo fuzz build 2>&1 | tail -n 20; then
    echo "FAILED: cargo fuzz build"
    exit 1
fi
t_build=$(( $(date +%s) - t0 ))

# Per-target libFuzzer options: input size caps that fit each format.
opts_for() {
    case "$1" in
        format_decoders) echo "-max_len=16384" ;;
        codec_decompress) echo "-max_len=16384" ;;
        nbd_stream) echo "-max_len=4096 -detect_leaks=0" ;;
        engine_ops) echo "-max_len=521 -len_control=0" ;;
        *) echo "" ;;
    esac
}

failed=()
summary=()
for t in "${TARGETS[@]}"; do
    scratch=$WORK/corpus/$t
    artifacts=$WORK/artifacts/$t
    log=$WORK/$t.log
    mkdir -p "$scratch" "$artifacts"
    echo "smoke: $t for ${SECONDS_PER_TARGET}s"
    ts=$(date +%s)
    # shellcheck disable=SC2046
    cargo fuzz run "$t" "$scratch" "corpus/$t" -- \
        -max_total_time="$SECONDS_PER_TARGET" -timeout=20 \
        -artifact_prefix="$artifacts/" -print_final_stats=1 \
        $(opts_for "$t") >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - ts ))
    runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -n 1 | grep -o '[0-9]*')
    if [ $rc -ne 0 ]; then
        echo "----- $t FAILED (exit $rc); last lines of $log:"
        tail -n 60 "$log"
        echo "----- crash inputs in $artifacts:"
        ls -l "$artifacts"
        failed+=("$t")
        summary+=("$t: FAILED after ${secs}s (exit $rc)")
    else
        summary+=("$t: ok, ${runs:-?} runs in ${secs}s")
    fi
done
# cargo fuzz creates fuzz/artifacts/<target>/ even though the smoke
# sends artifacts elsewhere; drop the empty directories.
rmdir "$FUZZ_DIR"/artifacts/* "$FUZZ_DIR"/artifacts 2>/dev/null || true

echo "smoke: build ${t_build}s, total $(( $(date +%s) - t0 ))s"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -ne 0 ]; then
    echo "FAILED: ${failed[*]} (reproduce: see fuzz/README.md)"
    exit 1
fi
echo "smoke: all targets passed"
