# What the benchmark scripts share (sourced by bench-vs-reference.sh, bench-journal-vs-etcd.sh
# and bench-index.sh, from the repository's root): installing the reference server, building
# ours and the harness, recording the machine and the disk, and running the benchmark itself.

# Installs the reference server and sets $reference to its path; exits 2 (naming the
# calling script, $1) when it is not there.
bench_install_reference() {
  echo "== installing the reference server" >&2
  reference="$(scripts/install-reference.sh | tail -n 1)"
  [ -x "$reference" ] || { echo "$1: reference server not found at $reference" >&2; exit 2; }
}

# Builds our server and the harness in release mode.
bench_build() {
  echo "== building (release)" >&2
  scripts/install-protoc.sh >/dev/null
  cargo build --release --bin tephra-server -p tephra >&2
  cargo build --release -p tephra-bench >&2
}

# Writes the machine's description to $1/machine.txt (and stderr, under "== machine"): date,
# commit, kernel, CPUs, memory, load, the scratch directory ($3, labelled $2) and the disk
# under $4, rustc and the reference server.
bench_record_machine() {
  local out="$1" label="$2" dir="$3" disk="$4"
  echo "== machine" >&2
  {
    echo "date (UTC): $(date -u '+%Y-%m-%d %H:%M:%S')"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
    echo "kernel: $(uname -srvm)"
    echo "cpus: $(nproc) online"
    grep -m1 'model name' /proc/cpuinfo 2>/dev/null || true
    grep -E '^(MemTotal|MemAvailable)' /proc/meminfo 2>/dev/null || true
    echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "$label: $dir"
    df -hT "$disk" | tail -n 1
    echo "rustc: $(rustc --version)"
    echo "reference: $reference"
  } > "$out/machine.txt"
  cat "$out/machine.txt" >&2
}

# Runs the fsync probe on the scratch directory $1 with the block sizes $2 (comma separated),
# into $out/fsync.txt (and stderr); a failing probe does not stop the benchmark.
bench_fsync_probe() {
  echo "== fsync probe of $1" >&2
  target/release/tephra-bench fsync --dir "$1" --block-sizes "$2" > "$out/fsync.txt" || true
  cat "$out/fsync.txt" >&2
}

# Runs `tephra-bench "${@:2}"` under the heading $1, its stdout also into $out/table.md, and
# exits with its exit code (a failing run still files what it wrote).
bench_run() {
  local title="$1" code
  shift
  echo "== $title" >&2
  set +e
  target/release/tephra-bench "$@" | tee -i "$out/table.md"
  code=${PIPESTATUS[0]}
  set -e
  echo "results in $out (exit $code)" >&2
  exit "$code"
}
