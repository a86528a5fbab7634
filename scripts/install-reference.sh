#!/usr/bin/env bash
# Installs the reference Tephra server (tephra-server 0.4.4 from crates.io) that our
# compatibility tests and benchmarks run side by side with. Prints the binary's path.
#
#   scripts/install-reference.sh [ROOT]     (default ROOT: $HOME/.tephra-reference)
#
# Its build needs protoc 36.2 exactly; the crates.io package protoc-bin-vendored-linux-x86_64
# 3.3.0 ships that binary, so we fetch it through cargo and point PROTOC at it. The path of that
# protoc is also written to ROOT/protoc-path for builds that need it (the tephra-client tests).
set -euo pipefail
trap 'echo "install-reference: failed (line $LINENO, exit $?)" >&2' ERR
root="${1:-${TEPHRA_REFERENCE_ROOT:-$HOME/.tephra-reference}}"
bin="$root/bin/tephra-server"
find_protoc() {
  # On a fresh machine the registry does not exist yet: find fails, which under pipefail
  # would end the script here without a word. Nothing found is an empty answer, not an error.
  local src="${CARGO_HOME:-$HOME/.cargo}/registry/src"
  [ -d "$src" ] || return 0
  find "$src" -path '*protoc-bin-vendored-linux-x86_64-3.3.0/bin/protoc' -type f 2>/dev/null | head -n 1 || true
}
protoc="$(find_protoc)"
if [ -z "$protoc" ]; then
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
  (
    cd "$scratch"
    cargo init -q --name fetch-protoc >/dev/null
    cargo add -q protoc-bin-vendored-linux-x86_64@=3.3.0 >/dev/null
    cargo fetch -q
  )
  protoc="$(find_protoc)"
fi
[ -n "$protoc" ] || { echo "install-reference: protoc 36.2 not found after cargo fetch" >&2; exit 1; }
chmod +x "$protoc"
mkdir -p "$root"
echo "$protoc" > "$root/protoc-path"
if [ ! -x "$bin" ]; then
  PROTOC="$protoc" cargo install -q --locked tephra-server --version 0.4.4 --root "$root" >&2
fi
echo "$bin"
