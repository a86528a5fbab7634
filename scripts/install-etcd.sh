#!/usr/bin/env bash
# Installs etcd 3.4 from Debian's packages (etcd-server, etcd-client) when it is missing and
# prints the etcd binary's path on its last line. Idempotent. It never leaves a system
# service running: a policy-rc.d that forbids starting services is in place while apt runs
# (and removed afterwards), and an etcd that apt started anyway is stopped by its pid.
# The benchmark (`tephra-bench journal`) starts its own one-member etcd on loopback.
#
#   scripts/install-etcd.sh        # prints e.g. /usr/bin/etcd
#
# ETCD_BIN: use this binary instead (nothing is installed).
set -euo pipefail

if [ -n "${ETCD_BIN:-}" ]; then
  [ -x "$ETCD_BIN" ] || { echo "install-etcd: ETCD_BIN=$ETCD_BIN is not executable" >&2; exit 2; }
  echo "$ETCD_BIN"
  exit 0
fi

find_etcd() {
  for p in /usr/bin/etcd /usr/local/bin/etcd "$(command -v etcd 2>/dev/null || true)"; do
    [ -n "$p" ] && [ -x "$p" ] && { echo "$p"; return 0; }
  done
  return 1
}

if ! bin="$(find_etcd)"; then
  echo "== installing etcd-server and etcd-client (Debian packages)" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  # Existing etcd pids: whatever apt starts besides them is ours to stop.
  before="$(pgrep -x etcd || true)"
  policy=/usr/sbin/policy-rc.d
  made_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod +x "$policy"
    made_policy=1
  fi
  cleanup() { [ "$made_policy" = 1 ] && $sudo rm -f "$policy"; return 0; }
  trap cleanup EXIT
  if ! apt-cache policy etcd-server 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    $sudo apt-get update -q >&2
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends etcd-server etcd-client >&2
  for pid in $(pgrep -x etcd || true); do
    case " $before " in
      *" $pid "*) ;;
      *) echo "install-etcd: stopping the etcd apt started (pid $pid)" >&2; $sudo kill "$pid" || true ;;
    esac
  done
  bin="$(find_etcd)" || { echo "install-etcd: etcd not found after installing" >&2; exit 1; }
fi
echo "install-etcd: $("$bin" --version 2>/dev/null | head -n 1)" >&2
echo "$bin"
