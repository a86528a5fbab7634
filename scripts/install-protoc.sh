#!/usr/bin/env bash
# Puts the pinned protoc (36.2, from the crates.io package protoc-bin-vendored-linux-x86_64
# 3.3.0, fetched through cargo) at target/tools/protoc, where .cargo/config.toml points the
# build at it (tikv's raft crate compiles its protobuf files with it), and prints its path.
# Idempotent: a second run only prints the path.
#
#   scripts/install-protoc.sh
set -euo pipefail
trap 'echo "install-protoc: failed (line $LINENO, exit $?)" >&2' ERR
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$repo/target/tools/protoc"
find_protoc() {
  # On a fresh machine the registry does not exist yet: nothing found is an empty answer.
  local src="${CARGO_HOME:-$HOME/.cargo}/registry/src"
  [ -d "$src" ] || return 0
  find "$src" -path '*protoc-bin-vendored-linux-x86_64-3.3.0/bin/protoc' -type f 2>/dev/null | head -n 1 || true
}
if [ ! -x "$dest" ]; then
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
  [ -n "$protoc" ] || { echo "install-protoc: protoc 36.2 not found after cargo fetch" >&2; exit 1; }
  mkdir -p "$(dirname "$dest")"
  cp "$protoc" "$dest.tmp"
  chmod +x "$dest.tmp"
  mv "$dest.tmp" "$dest"
fi
echo "$dest"
