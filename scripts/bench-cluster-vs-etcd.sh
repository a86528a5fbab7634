#!/usr/bin/env bash
# Runs `tephra-bench cluster` (replicated journals on a three-node cluster of ours vs a
# three-member etcd 3.4 cluster, side by side, plus failover and each write workload on one
# node of ours) from a fresh checkout and files the results under bench-results/:
#
#   scripts/bench-cluster-vs-etcd.sh [--quick] [more tephra-bench cluster options...]
#
# It installs etcd from Debian's packages (scripts/install-etcd.sh; no system service is left
# running: the harness starts its own members on loopback and stops them by pid), builds our
# server and the harness in release mode (protoc through scripts/install-protoc.sh), records
# the machine and the fsync probe's output, then runs the benchmark. Every node's and member's
# data directory goes to $BENCH_DIR (default: target/bench-cluster/data, on the same disk as
# the checkout; never a tmpfs); everything else to bench-results/<UTC date>-cluster/
# (cluster.md, cluster.json, table.md, logs/).
# --quick: 1 round x 2 s after 1 s per run and 2 failover trials (a smoke run, about 5 minutes).
# Exit code: that of `tephra-bench cluster` (0 ok, 1 a run failed, 2 usage, 130 interrupted).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
. scripts/bench-common.sh

echo "== installing etcd" >&2
etcd="$(scripts/install-etcd.sh | tail -n 1)"
[ -x "$etcd" ] || { echo "bench-cluster-vs-etcd: etcd not found at $etcd" >&2; exit 2; }
reference="etcd: $etcd ($("$etcd" --version 2>/dev/null | head -n 1))"
bench_build

stamp="$(date -u +%Y%m%dT%H%M%SZ)"
out="$repo/bench-results/$stamp-cluster"
data="${BENCH_DIR:-$repo/target/bench-cluster/data}"
mkdir -p "$out" "$data"

bench_record_machine "$out" "scratch dir" "$data" "$data"

bench_fsync_probe "$data" 4k,64k
bench_run "replicated journals vs etcd" cluster --etcd "$etcd" --ours target/release/tephra-server \
  --dir "$data" --out "$out" "$@"
