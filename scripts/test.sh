#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what the tests need (the reference
# tephra-server for the compatibility tests, protoc 36.2 for our build and the published client, and etcd 3.4
# for the journal benchmark's test),
# builds our server in release, runs every workspace test, then runs the published
# tephra-client 0.5.3 (tests/published-client, its own workspace) against our server.
#
# Extra arguments go to the workspace `cargo test` only.
set -euo pipefail
cd "$(dirname "$0")/.."
# protoc 36.2 first: tikv's raft crate runs it when it builds (and so does the published client).
PROTOC="$(scripts/install-protoc.sh)"
export PROTOC
# Style and lints first: they take seconds and fail before the long build.
cargo fmt --all --check
cargo clippy --release --workspace --all-targets -- -D warnings
ref="$(scripts/install-reference.sh)"
export TEPHRA_REFERENCE_SERVER="$ref"
# etcd 3.4 for the journal benchmark's short test (bench-harness/tests/journal_bench.rs); the
# test runs against ours alone, and says SKIPPED loudly, when etcd cannot be installed.
if etcd_bin="$(scripts/install-etcd.sh | tail -n 1)" && [ -x "$etcd_bin" ]; then
  export ETCD_BIN="$etcd_bin"
else
  echo "" >&2
  echo "*** test.sh: etcd could not be installed (scripts/install-etcd.sh): the journal benchmark test runs against ours only ***" >&2
  echo "" >&2
fi
# The crash harness (tests/crash/tests/crash_ci.rs) needs tephra-server built with the crash-points
# feature; build it here (only the tephra crate is recompiled) and keep a copy apart, since the
# normal build below puts the plain binary back in target/release.
cargo build --release --features crash-points --bin tephra-server
mkdir -p target/crash-points
cp target/release/tephra-server target/crash-points/tephra-server
export TEPHRA_CRASH_SERVER="$PWD/target/crash-points/tephra-server"

cargo build --release --bin tephra-server
cargo test --workspace --release "$@"

# The published client's build (tephra-proto) needs protoc 36.2 exactly: the one above.
TEPHRA_SERVER_BIN="$PWD/target/release/tephra-server" \
  cargo test --release --locked --manifest-path tests/published-client/Cargo.toml --target-dir target/published-client
