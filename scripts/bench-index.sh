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

echo "== installing the reference server" >&2
reference="$(scripts/install-reference.sh | tail -n 1)"
[ -x "$reference" ] || { echo "bench-index: reference server not found at $reference" >&2; exit 2; }

echo "== building (release)" >&2
cargo build --release --bin tephra-server -p tephra >&2
cargo build --release -p tephra-bench >&2

stamp="$(date -u +%Y%m%dT%H%M%SZ)"
out="$repo/bench-results/$stamp-index"
data="${BENCH_INDEX_DIR:-$repo/target/bench-index}/data-$events-$tags"
mkdir -p "$out" "$(dirname "$data")"

{
  echo "date (UTC): $(date -u '+%Y-%m-%d %H:%M:%S')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
  echo "kernel: $(uname -srvm)"
  echo "cpus: $(nproc) online"
  grep -m1 'model name' /proc/cpuinfo 2>/dev/null || true
  grep -E '^(MemTotal|MemAvailable)' /proc/meminfo 2>/dev/null || true
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "data dir: $data"
  df -hT "$(dirname "$data")" | tail -n 1
  echo "rustc: $(rustc --version)"
  echo "reference: $reference"
} > "$out/machine.txt"
cat "$out/machine.txt" >&2

echo "== prepare ($events events)" >&2
target/release/tephra-bench index prepare --dir "$data" --events "$events" --tags "$tags" \
  --ours target/release/tephra-server --force | tee "$out/prepare.txt"

echo "== run" >&2
set +e
target/release/tephra-bench index run --dir "$data" --ours target/release/tephra-server \
  --reference "$reference" --out "$out" "${run_args[@]}" | tee -i "$out/table.md"
code=${PIPESTATUS[0]}
set -e
echo "results in $out (exit $code)" >&2
exit "$code"
