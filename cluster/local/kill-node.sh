#!/usr/bin/env bash
# Simulates the loss of one node of the local cluster: SIGKILL, without warning, to every
# process of that node (`ray start --block`, its raylet, agents and the Ray workers running
# its trials), found by the session id that start.sh recorded as the node's pid.
#
#   cluster/local/kill-node.sh [-d DIR] worker-2
#
# Ray notices the node is gone when the raylet's health checks fail (head setting
# RAY_health_check_period_ms x RAY_health_check_failure_threshold; Ray's default is 3 s x 5).
set -euo pipefail

dir="/tmp/haepo-local-$(id -u)"
node=""
while [ $# -gt 0 ]; do
  case "$1" in
    -d|--dir) dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "kill-node.sh: error: unknown option $1" >&2; exit 2 ;;
    *) node="$1"; shift ;;
  esac
done
[ -n "$node" ] || { echo "kill-node.sh: error: which node? e.g. worker-1" >&2; exit 2; }
f="$dir/pids/$node.pid"
[ -e "$f" ] || { echo "kill-node.sh: error: no node $node in $dir (no $f)" >&2; exit 2; }

leader="$(cat "$f")"
pids="$(ps -eo pid=,sid= | awk -v sid="$leader" '$2 == sid { print $1 }')"
[ -n "$pids" ] || { echo "kill-node.sh: $node (pid $leader) is not running" >&2; exit 1; }
# shellcheck disable=SC2086
kill -KILL $pids
echo "killed $node: $(echo $pids)"
