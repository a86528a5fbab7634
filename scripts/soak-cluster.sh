#!/usr/bin/env bash
# Soak of the cluster fault-injection test (tests/cluster_faults.rs, docs/journals.md §9):
# runs its seeded runs (clients on a single- and a multi-writer journal while a nemesis kills,
# pauses, partitions and slows nodes, then the linearizability and durability checks) over a
# range of seeds, in batches, on three- and five-node clusters; prints every seed that found a
# violation with the file holding its nemesis log and histories, and the count of runs.
#
#   scripts/soak-cluster.sh                          # seeds 1-200, on 3 and on 5 nodes
#   scripts/soak-cluster.sh 1-30                     # a range of seeds
#   scripts/soak-cluster.sh 1-200 --nodes 3 --batch 20 --secs 15
#
# --nodes 3|5|both (default both), --batch N seeds per test process (default 10), --secs N
# seconds of faults per run (default TEPHRA_FAULT_SECS, else 10). Batch logs go to
# target/soak-cluster/. Exit status 0 when every run held; 1 on any violation or failed batch.
set -euo pipefail
cd "$(dirname "$0")/.."
range="1-200"
nodes="both"
batch=10
secs="${TEPHRA_FAULT_SECS:-10}"
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --secs) secs="$2"; shift 2 ;;
    [0-9]*) range="$1"; shift ;;
    *) echo "soak-cluster: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
case "$range" in
  *-*) first="${range%-*}"; last="${range#*-}" ;;
  *) first="$range"; last="$range" ;;
esac
case "$nodes" in
  3) tests="faults_on_three_nodes_keep_every_journal_linearizable" ;;
  5) tests="faults_on_five_nodes_keep_every_journal_linearizable" ;;
  both) tests="faults_on_three_nodes_keep_every_journal_linearizable faults_on_five_nodes_keep_every_journal_linearizable" ;;
  *) echo "soak-cluster: --nodes is 3, 5 or both" >&2; exit 2 ;;
esac
# protoc 36.2 first: tikv's raft crate runs it when it builds.
PROTOC="$(scripts/install-protoc.sh)"
export PROTOC
cargo build --release --bins
cargo test --release --no-run --test cluster_faults
logs="target/soak-cluster/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$logs"
runs=0
violations=()
failed_batches=()
for test in $tests; do
  from="$first"
  while [ "$from" -le "$last" ]; do
    to=$((from + batch - 1))
    [ "$to" -le "$last" ] || to="$last"
    log="$logs/$test-$from-$to.log"
    echo "soak-cluster: $test seeds $from-$to" >&2
    status=0
    # A batch that hangs (a seed whose clients never get an answer) is stopped and reported
    # as a failed batch: at most 120 s a seed.
    TEPHRA_FAULT_SEEDS="$from-$to" TEPHRA_FAULT_SECS="$secs" \
      timeout --kill-after=10 $(( (to - from + 1) * (secs + 110) )) \
      cargo test --release --quiet --test cluster_faults "$test" -- --exact --nocapture >"$log" 2>&1 || status=$?
    [ "$status" -ne 124 ] && [ "$status" -ne 137 ] || echo "soak-cluster: $test seeds $from-$to timed out; its servers may be left running" >&2
    held=$(grep -c '^seed [0-9]* on [0-9]* nodes: held' "$log" || true)
    runs=$((runs + held))
    while IFS= read -r line; do
      [ -n "$line" ] || continue
      echo "$line" >&2
      violations+=("$line")
      runs=$((runs + 1))
    done < <(grep '^VIOLATION' "$log" || true)
    if [ "$status" -ne 0 ] && ! grep -q '^VIOLATION' "$log"; then
      echo "soak-cluster: $test seeds $from-$to failed without a VIOLATION line; see $log" >&2
      failed_batches+=("$test $from-$to ($log)")
    fi
    from=$((to + 1))
  done
done
echo "soak-cluster: $runs runs (seeds $first-$last, $nodes nodes, $secs s of faults each), ${#violations[@]} violations, ${#failed_batches[@]} failed batches; logs in $logs"
for v in "${violations[@]}"; do echo "  $v"; done
for b in "${failed_batches[@]}"; do echo "  failed batch: $b"; done
[ "${#violations[@]}" -eq 0 ] && [ "${#failed_batches[@]}" -eq 0 ]
