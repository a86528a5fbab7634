#!/usr/bin/env bash
# Starts two tephra-server processes on one port at nearly the same moment (0-8 ms apart,
# different data directories), N times, and counts how often exactly one, both or none were
# listening 2.5 s later. Exactly one is the only right answer: two would split clients between
# two stores; none means both refused.
#
#   scripts/start-race.sh [TRIES] [FIRST_PORT]     (defaults: 30, 20000)
#
# Builds the release server first. Exit code: 0 when every try had exactly one listener.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
tries="${1:-30}"
first_port="${2:-20000}"
scripts/install-protoc.sh >/dev/null
cargo build --release --quiet --bin tephra-server
bin="$repo/target/release/tephra-server"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
one=0 both=0 none=0
for i in $(seq 1 "$tries"); do
  port=$((first_port + i))
  d="$scratch/$i"
  mkdir -p "$d"
  "$bin" --bind "127.0.0.1:$port" --data-dir "$d/a" > "$d/a.log" 2>&1 & a=$!
  sleep "0.00$((RANDOM % 9))"
  "$bin" --bind "127.0.0.1:$port" --data-dir "$d/b" > "$d/b.log" 2>&1 & b=$!
  sleep 2.5
  up=0
  for x in a b; do
    pid=$a
    [ "$x" = b ] && pid=$b
    if kill -0 "$pid" 2>/dev/null && grep -q "tephra server listening" "$d/$x.log"; then
      up=$((up + 1))
    fi
  done
  case $up in
    1) one=$((one + 1)) ;;
    2) both=$((both + 1)); echo "try $i: both listening" >&2 ;;
    *) none=$((none + 1)); echo "try $i: none listening" >&2; grep -h "cannot" "$d"/*.log >&2 || true ;;
  esac
  kill "$a" "$b" 2>/dev/null || true
  wait "$a" "$b" 2>/dev/null || true
  rm -rf "$d"
done
echo "tries=$tries one=$one both=$both none=$none"
[ "$one" = "$tries" ]
