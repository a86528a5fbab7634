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
. scripts/bench-common.sh

mode=full
for a in "$@"; do
  [ "$a" = "--quick" ] && mode=quick
done

bench_install_reference bench-vs-reference
bench_build

stamp="$(date -u +%Y%m%dT%H%M%SZ)"
out="$repo/bench-results/$stamp-$mode"
data="${BENCH_DIR:-$repo/target/bench-compare/data}"
mkdir -p "$out" "$data"

bench_record_machine "$out" "scratch dir" "$data" "$data"

bench_fsync_probe "$data" 4k,64k,1m
bench_run "compare ($mode)" compare --reference "$reference" --ours target/release/tephra-server \
  --dir "$data" --out "$out" "$@"
