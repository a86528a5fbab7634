#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what the tests need (the reference
# tephra-server for the compatibility tests), then runs every workspace test.
set -euo pipefail
cd "$(dirname "$0")/.."
ref="$(scripts/install-reference.sh)"
export TEPHRA_REFERENCE_SERVER="$ref"
cargo test --workspace --release "$@"
