#!/usr/bin/env bash
# The one entry point for every check (STYLE habit 12): formatting, lints
# with warnings denied, the whole test suite (unit, engine simulator, CLI,
# real NBD clients), the tests in the qemu test guest (scripts/guest/), and
# the fuzz smoke when cargo-fuzz is available.
#
#   bash scripts/test.sh            # what CI runs
#   SQUEEZE_SIM_SEEDS=20000 bash scripts/test.sh   # a longer crash simulation
#
# Tests that need an external client (qemu-io, fio, nbdinfo, nbdcopy) print
# a loud SKIPPED line when it is missing, and fail instead when CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s (disk: %s free)\n' "$*" "$(df -h --output=avail . | tail -1 | tr -d ' ')"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "the house rules (scripts/check_house.py: no engine import cycle, no file over 800 lines without a reason, no subcommand importing another)"
python3 scripts/check_house.py

step "bench/report.py, bench/pg_fillfactor.py and bench/results.py tests"
# report.py draws its charts with `squeeze chart`: the debug binary, built here
cargo build -p squeeze --bin squeeze
SQUEEZE_BIN=${CARGO_TARGET_DIR:-target}/debug/squeeze python3 bench/test_report.py
python3 bench/test_pg_fillfactor.py
python3 bench/test_results.py

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test (SQUEEZE_SIM_SEEDS=${SQUEEZE_SIM_SEEDS:=2000} crash-simulation seeds)"
export SQUEEZE_SIM_SEEDS
cargo test --workspace --no-fail-fast

step "guest tests (tests/guest/*.sh: the kernel's NBD client on squeeze, in a qemu guest)"
bash scripts/guest/test.sh

if [[ -x fuzz/smoke.sh ]]; then
  step "fuzz smoke"
  fuzz/smoke.sh
fi
