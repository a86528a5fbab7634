#!/usr/bin/env bash
# The index issue's benchmark (issue 6), our server vs the reference tephra-server 0.4.4 on
# the same log, from a fresh checkout:
#
#   scripts/bench-index.sh [--events N] [--tags N] [more tephra-bench index run options...]
#
# It installs the reference server (scripts/install-reference.sh), builds our server and
# the harness in release mode, prepares the log (N events, default 10,000,000, of 256 bytes
# over --tags bulk tags, default 100,000 and at most N, plus 1,000 rare tags on 10 events
# each, in 256 MiB segments) in $BENCH_INDEX_DIR/data-N-TAGS (default
# target/bench-index/data-N-TAGS; a directory already prepared the same way is reused,
# anything else there is replaced), then runs
# `tephra-bench index run`: cold and warm open, selective reads, type-only reads and
# conditional appends naming a rare tag, on ours, the reference and ours forced to scan.
# Results go to bench-results/<UTC date>-index/ (index.md, index.json, table.md, the
# prepare summary, the machine, the servers' logs).
# Exit code: that of `tephra-bench index run` (0 ok, 1 a run failed or a server returned
# a wrong result, 2 usage, 130 interrupted).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
. scripts/bench-common.sh

events=10000000
tags=100000
run_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --events) events="$2"; shift 2 ;;
    --events=*) events="${1#--events=}"; shift ;;
    --tags) tags="$2"; shift 2 ;;
    --tags=*) tags="${1#--tags=}"; shift ;;
    *) run_args+=("$1"); shift ;;
  esac
done
for n in "$events" "$tags"; do
  case "$n" in
    ''|*[!0-9]*) echo "bench-index: --events and --tags need a number, got '$n'" >&2; exit 2 ;;
  esac
done

bench_install_reference bench-index
bench_build

stamp="$(date -u +%Y%m%dT%H%M%SZ)"
out="$repo/bench-results/$stamp-index"
data="${BENCH_INDEX_DIR:-$repo/target/bench-index}/data-$events-$tags"
mkdir -p "$out" "$(dirname "$data")"

bench_record_machine "$out" "data dir" "$data" "$(dirname "$data")"

echo "== prepare ($events events)" >&2
target/release/tephra-bench index prepare --dir "$data" --events "$events" --tags "$tags" \
  --ours target/release/tephra-server --force | tee "$out/prepare.txt"

bench_run run index run --dir "$data" --ours target/release/tephra-server \
  --reference "$reference" --out "$out" "${run_args[@]}"
