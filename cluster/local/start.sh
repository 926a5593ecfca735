#!/usr/bin/env bash
# A real multi-node Ray cluster on this one machine, plus a local MLflow server, for
# development and tests: a head node and N worker nodes, each its own `ray start --block`
# process (own resources, own ports), token authentication on, and `mlflow server` with a
# SQLite store. Everything it starts is recorded by pid under the state directory;
# cluster/local/stop.sh stops exactly those processes (never `ray stop`).
#
#   cluster/local/start.sh                      # head (0 CPUs) + 2 workers (1 CPU, gpu_slot 1)
#   source /tmp/haepo-local-$(id -u)/env.sh     # RAY_AUTH_*, RAY_API_SERVER_ADDRESS, MLFLOW_TRACKING_URI
#   haepo submit tune_configs/smoke.yaml --storage-path "$HAEPO_STORAGE_PATH" --follow
#   cluster/local/stop.sh
#
# Options:
#   -d, --dir DIR             state directory (default /tmp/haepo-local-<uid>); keep it short:
#                             Ray's unix sockets live below it (107-character limit)
#   -w, --workers N           worker nodes (default 2)
#   --head-cpus N             CPUs of the head (default 0: trials run on workers only)
#   --worker-cpus N           CPUs of each worker (default 1)
#   --worker-resources JSON   custom resources of each worker (default {"gpu_slot": 1}:
#                             stands in for one GPU; a trial asks for it with the setting
#                             custom_resources_for_main_process: {gpu_slot: 0.5})
#   --same-ip                 every node on 127.0.0.1 (default: worker i on 127.0.0.<i+1>,
#                             all loopback, so a trial's node_ip names its node)
#   --object-store-mb MB      object store of each node (default 150)
#   --no-mlflow               do not start the MLflow server
#   --ray-bin PATH            the `ray` to run (default: the repository's .venv, else PATH);
#                             its directory goes first on every node's PATH (so jobs find
#                             `haepo`, and `mlflow` is taken from there too)
#
# Environment: RAY_health_check_* and other RAY_* settings in the environment reach every
# node (the tests shorten node-failure detection that way). Token: DIR/auth_token, made here;
# the user's ~/.ray/auth_token is neither read nor written.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

dir="/tmp/haepo-local-$(id -u)"
workers=2
head_cpus=0
worker_cpus=1
worker_resources='{"gpu_slot": 1}'
same_ip=0
object_store_mb=150
with_mlflow=1
ray_bin=""

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() { echo "start.sh: error: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    -d|--dir) dir="$2"; shift 2 ;;
    -w|--workers) workers="$2"; shift 2 ;;
    --head-cpus) head_cpus="$2"; shift 2 ;;
    --worker-cpus) worker_cpus="$2"; shift 2 ;;
    --worker-resources) worker_resources="$2"; shift 2 ;;
    --same-ip) same_ip=1; shift ;;
    --object-store-mb) object_store_mb="$2"; shift 2 ;;
    --no-mlflow) with_mlflow=0; shift ;;
    --ray-bin) ray_bin="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

case "$workers" in ''|*[!0-9]*) die "--workers needs a number, got '$workers'" ;; esac
[ "$workers" -le 250 ] || die "--workers: at most 250"

if [ -z "$ray_bin" ]; then
  if [ -x "$repo/.venv/bin/ray" ]; then ray_bin="$repo/.venv/bin/ray"; else ray_bin="$(command -v ray || true)"; fi
fi
[ -n "$ray_bin" ] && [ -x "$ray_bin" ] || die "no 'ray' found: install haepo-ray (make setup) or pass --ray-bin"
bin_dir="$(cd "$(dirname "$ray_bin")" && pwd)"
python="$bin_dir/python"
[ -x "$python" ] || python="$(command -v python3)"
export PATH="$bin_dir:$PATH"

mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
[ "${#dir}" -le 40 ] || die "--dir '$dir' is longer than 40 characters; Ray's socket paths below it would pass the 107-character limit"

# Refuse to start over a cluster that is still running.
if [ -d "$dir/pids" ]; then
  for f in "$dir"/pids/*.pid; do
    [ -e "$f" ] || continue
    if kill -0 "$(cat "$f")" 2>/dev/null; then
      die "a cluster is already running from $dir (pid $(cat "$f") in $f): run cluster/local/stop.sh -d $dir first"
    fi
  done
fi
rm -rf "$dir/pids" "$dir/logs" "$dir/nodes"
mkdir -p "$dir/pids" "$dir/logs" "$dir/nodes" "$dir/storage" "$dir/ray"
rm -rf "$dir/ray" "$dir"/w[0-9]*; mkdir -p "$dir/ray"

# Token authentication: a token of this cluster only, in a file only this user can read.
token_file="$dir/auth_token"
if [ ! -s "$token_file" ]; then
  (umask 077; "$python" "$here/lib.py" new-token > "$token_file")
fi
chmod 600 "$token_file"
unset RAY_AUTH_TOKEN
export RAY_AUTH_MODE=token
export RAY_AUTH_TOKEN_PATH="$token_file"
export RAY_USAGE_STATS_ENABLED=0

# start_proc NAME CMD...: CMD in its own session (process group = its pid), pid recorded.
start_proc() {
  local name="$1"; shift
  setsid "$@" > "$dir/logs/$name.log" 2>&1 < /dev/null &
  echo "$!" > "$dir/pids/$name.pid"
}

fail() {
  echo "start.sh: error: $1; see $2" >&2
  tail -n 20 "$2" >&2 || true
  "$here/stop.sh" -d "$dir" >&2 || true
  exit 1
}

read -r -a ports <<< "$("$python" "$here/lib.py" free-ports $((10 + 6 * workers)) | tr '\n' ' ')"
next=0
port() { echo "${ports[$next]}"; }
take() { next=$((next + 1)); }

object_store=$((object_store_mb * 1024 * 1024))

# ---- MLflow server (started first: its database migration runs while Ray starts)
mlflow_uri=""
if [ "$with_mlflow" = 1 ]; then
  mlflow_port="$(port)"; take
  mkdir -p "$dir/mlflow"
  start_proc mlflow env MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false "$bin_dir/mlflow" server --host 127.0.0.1 --port "$mlflow_port" \
    --backend-store-uri "sqlite:///$dir/mlflow/mlflow.db" \
    --artifacts-destination "$dir/mlflow/artifacts" --workers 1
  mlflow_uri="http://127.0.0.1:$mlflow_port"
else
  take
fi

# ---- head
gcs_port="$(port)"; take
dash_port="$(port)"; take
client_port="$(port)"; take
read -r wlow whigh <<< "$("$python" "$here/lib.py" port-range 100)"
start_proc head "$ray_bin" start --head --block --disable-usage-stats \
  --node-ip-address 127.0.0.1 --port "$gcs_port" \
  --dashboard-host 127.0.0.1 --dashboard-port "$dash_port" --ray-client-server-port "$client_port" \
  --node-manager-port "$(port)" --object-manager-port "${ports[$((next + 1))]}" \
  --dashboard-agent-listen-port "${ports[$((next + 2))]}" --dashboard-agent-grpc-port "${ports[$((next + 3))]}" \
  --runtime-env-agent-port "${ports[$((next + 4))]}" --metrics-export-port "${ports[$((next + 5))]}" \
  --min-worker-port "$wlow" --max-worker-port "$whigh" \
  --num-cpus "$head_cpus" --num-gpus 0 --object-store-memory "$object_store" \
  --temp-dir "$dir/ray"
next=$((next + 6))
echo "127.0.0.1" > "$dir/nodes/head.ip"
dashboard="http://127.0.0.1:$dash_port"
"$python" "$here/lib.py" wait-dashboard "$dashboard" "$token_file" 120 || fail "the head did not start" "$dir/logs/head.log"

# ---- workers
# Each with its own --temp-dir (session folder): nodes on one machine must not share the
# sockets and runtime_resources folders (a worker node unpacking a job's working_dir there
# would replace the folder the head's job driver runs in).
for i in $(seq 1 "$workers"); do
  if [ "$same_ip" = 1 ]; then ip=127.0.0.1; else ip="127.0.0.$((i + 1))"; fi
  read -r wlow whigh <<< "$("$python" "$here/lib.py" port-range 100)"
  start_proc "worker-$i" "$ray_bin" start --block --disable-usage-stats \
    --address "127.0.0.1:$gcs_port" --node-ip-address "$ip" \
    --node-manager-port "$(port)" --object-manager-port "${ports[$((next + 1))]}" \
    --dashboard-agent-listen-port "${ports[$((next + 2))]}" --dashboard-agent-grpc-port "${ports[$((next + 3))]}" \
    --runtime-env-agent-port "${ports[$((next + 4))]}" --metrics-export-port "${ports[$((next + 5))]}" \
    --min-worker-port "$wlow" --max-worker-port "$whigh" \
    --num-cpus "$worker_cpus" --num-gpus 0 --resources "$worker_resources" \
    --object-store-memory "$object_store" --temp-dir "$dir/w$i"
  next=$((next + 6))
  echo "$ip" > "$dir/nodes/worker-$i.ip"
done
"$python" "$here/lib.py" wait-nodes "$dashboard" "$token_file" $((workers + 1)) 180 \
  || fail "not every worker joined" "$dir/logs/worker-$workers.log"

if [ -n "$mlflow_uri" ]; then
  "$python" "$here/lib.py" wait-http "$mlflow_uri/health" 120 || fail "the MLflow server did not start" "$dir/logs/mlflow.log"
fi

cat > "$dir/env.sh" <<EOF
# Written by cluster/local/start.sh: \`source\` it to talk to the local cluster.
export RAY_AUTH_MODE=token
export RAY_AUTH_TOKEN_PATH='$token_file'
export RAY_API_SERVER_ADDRESS='$dashboard'
export HAEPO_RAY_GCS_ADDRESS='127.0.0.1:$gcs_port'
export HAEPO_STORAGE_PATH='$dir/storage'
export MLFLOW_TRACKING_URI='$mlflow_uri'
EOF
[ -n "$mlflow_uri" ] || sed -i '/MLFLOW_TRACKING_URI/d' "$dir/env.sh"

{
  printf '{\n'
  printf '  "dir": "%s",\n  "dashboard": "%s",\n  "gcs_address": "127.0.0.1:%s",\n' "$dir" "$dashboard" "$gcs_port"
  printf '  "mlflow": "%s",\n  "storage_path": "%s/storage",\n  "token_file": "%s",\n' "$mlflow_uri" "$dir" "$token_file"
  printf '  "nodes": {\n'
  printf '    "head": {"pid": %s, "ip": "127.0.0.1"}' "$(cat "$dir/pids/head.pid")"
  for i in $(seq 1 "$workers"); do
    printf ',\n    "worker-%s": {"pid": %s, "ip": "%s"}' "$i" "$(cat "$dir/pids/worker-$i.pid")" "$(cat "$dir/nodes/worker-$i.ip")"
  done
  printf '\n  }\n}\n'
} > "$dir/cluster.json"

echo "local Ray cluster up: head + $workers workers (state and logs in $dir)"
echo "  dashboard / Jobs API: $dashboard   (token: $token_file)"
echo "  Ray (GCS):            127.0.0.1:$gcs_port"
[ -z "$mlflow_uri" ] || echo "  MLflow:               $mlflow_uri"
echo "  shared storage:       $dir/storage"
echo "next: source $dir/env.sh && haepo submit tune_configs/smoke.yaml --storage-path \"\$HAEPO_STORAGE_PATH\" --follow"
echo "stop: $here/stop.sh -d $dir"
