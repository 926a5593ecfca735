#!/usr/bin/env bash
# Stops what cluster/local/start.sh started, by the pids it recorded, and nothing else:
# never `ray stop` (which would stop every Ray instance of this user on the machine).
#
#   cluster/local/stop.sh [-d DIR] [--clean]
#
# Each node was started in its own session (setsid), so its session id is the recorded pid;
# every process of that session is signalled: `ray start --block`, and the GCS, raylet,
# dashboard, agents and Ray workers below it. Workers first, then the head, then MLflow:
# SIGTERM, up to 15 s of grace, then SIGKILL. The state directory (logs, token, MLflow
# database, shared storage) stays unless --clean is given.
set -euo pipefail

dir="/tmp/haepo-local-$(id -u)"
clean=0
while [ $# -gt 0 ]; do
  case "$1" in
    -d|--dir) dir="$2"; shift 2 ;;
    --clean) clean=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "stop.sh: error: unknown option $1" >&2; exit 2 ;;
  esac
done

if [ ! -d "$dir/pids" ]; then
  echo "stop.sh: nothing to stop in $dir (no pids/ folder)"
  exit 0
fi

# session_pids SID: every live process of the session SID (the leader included).
session_pids() {
  ps -eo pid=,sid= | awk -v sid="$1" '$2 == sid { print $1 }'
}

stop_session() {
  local name="$1" leader="$2" pids deadline
  pids="$(session_pids "$leader")"
  if [ -z "$pids" ]; then
    echo "  $name (pid $leader): not running"
    return 0
  fi
  # The leader first: `ray start --block` shuts its node down on SIGTERM.
  kill -TERM "$leader" 2>/dev/null || true
  deadline=$((SECONDS + 15))
  while [ $SECONDS -lt $deadline ] && [ -n "$(session_pids "$leader")" ]; do
    sleep 0.5
    # What outlives its parent gets SIGTERM too.
    kill -0 "$leader" 2>/dev/null || for p in $(session_pids "$leader"); do kill -TERM "$p" 2>/dev/null || true; done
  done
  pids="$(session_pids "$leader")"
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    echo "  $name (pid $leader): stopped (SIGKILL for: $(echo $pids))"
  else
    echo "  $name (pid $leader): stopped"
  fi
}

echo "stopping the local cluster of $dir"
for f in "$dir"/pids/worker-*.pid "$dir"/pids/head.pid "$dir"/pids/mlflow.pid; do
  [ -e "$f" ] || continue
  name="$(basename "$f" .pid)"
  stop_session "$name" "$(cat "$f")"
  rm -f "$f"
done

if [ "$clean" = 1 ]; then
  rm -rf "$dir"
  echo "removed $dir"
fi
