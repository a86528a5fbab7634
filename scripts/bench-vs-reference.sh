#!/usr/bin/env bash
# Runs `tephra-bench compare` (our server vs the reference tephra-server 0.4.4) from a
# fresh checkout and files the results under bench-results/:
#
#   scripts/bench-vs-reference.sh [--quick] [more tephra-bench compare options...]
#
# It installs the reference server (scripts/install-reference.sh), builds our server and
# the harness in release mode, records the machine (uname, CPUs, memory, the disk under
# the scratch directory) and the fsync probe's output, then runs the comparison. The
# servers' data directories go to $BENCH_DIR (default: target/bench-compare/data, on the
# same disk as the checkout); everything else to bench-results/<UTC date>-<quick|full>/.
# Exit code: that of `tephra-bench compare` (0 ok, 1 a run failed, 2 usage, 130 interrupted;
# Ctrl-C stops the servers and keeps the partial results).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

mode=full
for a in "$@"; do
  [ "$a" = "--quick" ] && mode=quick
done

echo "== installing the reference server" >&2
reference="$(scripts/install-reference.sh | tail -n 1)"
[ -x "$reference" ] || { echo "bench-vs-reference: reference server not found at $reference" >&2; exit 2; }

echo "== building (release)" >&2
cargo build --release --bin tephra-server -p tephra >&2
cargo build --release -p tephra-bench >&2

stamp="$(date -u +%Y%m%dT%H%M%SZ)"
out="$repo/bench-results/$stamp-$mode"
data="${BENCH_DIR:-$repo/target/bench-compare/data}"
mkdir -p "$out" "$data"

echo "== machine" >&2
{
  echo "date (UTC): $(date -u '+%Y-%m-%d %H:%M:%S')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
  echo "kernel: $(uname -srvm)"
  echo "cpus: $(nproc) online"
  grep -m1 'model name' /proc/cpuinfo 2>/dev/null || true
  grep -E '^(MemTotal|MemAvailable)' /proc/meminfo 2>/dev/null || true
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "scratch dir: $data"
  df -hT "$data" | tail -n 1
  echo "rustc: $(rustc --version)"
  echo "reference: $reference"
} > "$out/machine.txt"
cat "$out/machine.txt" >&2

echo "== fsync probe of $data" >&2
target/release/tephra-bench fsync --dir "$data" --block-sizes 4k,64k,1m > "$out/fsync.txt" || true
cat "$out/fsync.txt" >&2

echo "== compare ($mode)" >&2
set +e
target/release/tephra-bench compare --reference "$reference" --ours target/release/tephra-server \
  --dir "$data" --out "$out" "$@" | tee -i "$out/table.md"
code=${PIPESTATUS[0]}
set -e
echo "results in $out (exit $code)" >&2
exit "$code"
