#!/usr/bin/env bash
# Crash-consistency harness (tests/crash/): builds tephra-server with the `crash-points` feature and
# the tephra-crash driver into target/crash (apart from the normal build), then runs a mode.
#
#   scripts/crash-soak.sh --cycles N --seed S            # SIGKILL soak over all four workloads
#   scripts/crash-soak.sh soak --cycles N --seed S --workload pure,mixed --segment-size 262144
#   scripts/crash-soak.sh points|faults|corruption --seed S
#   scripts/crash-soak.sh liveness --seed S --cycles 200 # starts until the server stops answering
#   scripts/crash-soak.sh verify --seed S --run-dir DIR  # re-check a (copy of a) kept round dir
#   scripts/crash-soak.sh ci --seed S --cycles 50        # what CI runs: short soak + every point,
#                                                        # fault and corruption case
#
# Exit status 0 when every invariant held; 1 on a violation, printed with the seed and the
# cycle, with the data directory, witness and server log kept under target/crash-runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=soak
case "${1:-}" in
  soak|points|faults|corruption|ci|liveness|verify) mode="$1"; shift ;;
esac
export CARGO_TARGET_DIR="${CRASH_TARGET_DIR:-$PWD/target/crash}"
scripts/install-protoc.sh >/dev/null
cargo build --release --quiet -p tephra --features crash-points --bin tephra-server
cargo build --release --quiet -p tephra-crash --bin tephra-crash
exec "$CARGO_TARGET_DIR/release/tephra-crash" "$mode" --server "$CARGO_TARGET_DIR/release/tephra-server" "$@"
