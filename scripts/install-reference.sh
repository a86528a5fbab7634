#!/usr/bin/env bash
# Installs the reference Tephra server (tephra-server 0.4.4 from crates.io) that our
# compatibility tests and benchmarks run side by side with. Prints the binary's path.
#
#   scripts/install-reference.sh [ROOT]     (default ROOT: $HOME/.tephra-reference)
#
# Its build needs protoc 36.2 exactly: scripts/install-protoc.sh provides it. The path of that
# protoc is also written to ROOT/protoc-path for builds that need it (the tephra-client tests).
set -euo pipefail
trap 'echo "install-reference: failed (line $LINENO, exit $?)" >&2' ERR
root="${1:-${TEPHRA_REFERENCE_ROOT:-$HOME/.tephra-reference}}"
bin="$root/bin/tephra-server"
protoc="$("$(dirname "${BASH_SOURCE[0]}")/install-protoc.sh")"
mkdir -p "$root"
echo "$protoc" > "$root/protoc-path"
if [ ! -x "$bin" ]; then
  PROTOC="$protoc" cargo install -q --locked tephra-server --version 0.4.4 --root "$root" >&2
fi
echo "$bin"
