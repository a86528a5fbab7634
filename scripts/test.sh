#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what the tests need (the reference
# tephra-server for the compatibility tests), then runs every workspace test.
set -euo pipefail
cd "$(dirname "$0")/.."
ref="$(scripts/install-reference.sh)"
export TEPHRA_REFERENCE_SERVER="$ref"
# The crash harness (crash/tests/crash_ci.rs) needs tephra-server built with the crash-points
# feature; build it here (only the tephra crate is recompiled) and keep a copy apart, since the
# normal build below puts the plain binary back in target/release.
cargo build --release --features crash-points --bin tephra-server
mkdir -p target/crash-points
cp target/release/tephra-server target/crash-points/tephra-server
export TEPHRA_CRASH_SERVER="$PWD/target/crash-points/tephra-server"
cargo test --workspace --release "$@"
