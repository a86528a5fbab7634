#!/usr/bin/env bash
# Runs `tephra-bench journal` (the journal API on our server vs a one-member etcd 3.4, side by
# side) from a fresh checkout and files the results under bench-results/:
#
#   scripts/bench-journal-vs-etcd.sh [--quick] [more tephra-bench journal options...]
#
# It installs etcd from Debian's packages (scripts/install-etcd.sh; no system service is left
# running: the harness starts its own etcd on loopback and stops it by pid), builds our server
# and the harness in release mode, records the machine and the fsync probe's output, then runs
# the benchmark. Both systems' data directories go to $BENCH_DIR (default:
# target/bench-journal/data, on the same disk as the checkout; never a tmpfs); everything else
# to bench-results/<UTC date>-journal/ (journal.md, journal.json, table.md, logs/).
# Exit code: that of `tephra-bench journal` (0 ok, 1 a run failed, 2 usage, 130 interrupted).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
. scripts/bench-common.sh

echo "== installing etcd" >&2
etcd="$(scripts/install-etcd.sh | tail -n 1)"
[ -x "$etcd" ] || { echo "bench-journal-vs-etcd: etcd not found at $etcd" >&2; exit 2; }
reference="etcd: $etcd ($("$etcd" --version 2>/dev/null | head -n 1))"
bench_build

stamp="$(date -u +%Y%m%dT%H%M%SZ)"
out="$repo/bench-results/$stamp-journal"
data="${BENCH_DIR:-$repo/target/bench-journal/data}"
mkdir -p "$out" "$data"

bench_record_machine "$out" "scratch dir" "$data" "$data"

bench_fsync_probe "$data" 4k,64k
bench_run "journal vs etcd" journal --etcd "$etcd" --ours target/release/tephra-server \
  --dir "$data" --out "$out" "$@"
