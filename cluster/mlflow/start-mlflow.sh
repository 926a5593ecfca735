#!/usr/bin/env bash
# Entrypoint of the MLflow server image (cluster/mlflow/Dockerfile): MLflow with a PostgreSQL
# backend store, artifacts proxied by the server (clients and Ray nodes need only HTTP access
# to MLflow, no storage credentials), and MLflow's basic-auth app (every request needs a user
# and password). Configuration comes from the environment only; nothing secret is written
# to the command line (`ps`) or to the image.
#
# Required: POSTGRES_HOST, POSTGRES_USER, POSTGRES_PASSWORD, MLFLOW_AUTH_ADMIN_PASSWORD,
#           MLFLOW_ARTIFACTS_DESTINATION (s3://BUCKET/mlflow, gs://..., or a mounted folder)
# Optional: POSTGRES_PORT (5432), POSTGRES_DB (mlflow), MLFLOW_AUTH_DB (mlflow_auth),
#           MLFLOW_AUTH_ADMIN_USERNAME (admin), MLFLOW_AUTH_DEFAULT_PERMISSION (EDIT: every
#           signed-in user may log to every experiment; READ for read-only by default),
#           MLFLOW_SERVER_ALLOWED_HOSTS (Host headers accepted; default: localhost and private
#           IPs), MLFLOW_PORT (5000), MLFLOW_WORKERS (4)
set -euo pipefail

: "${POSTGRES_HOST:?set POSTGRES_HOST}"
: "${POSTGRES_USER:?set POSTGRES_USER}"
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD (from a secret)}"
: "${MLFLOW_AUTH_ADMIN_PASSWORD:?set MLFLOW_AUTH_ADMIN_PASSWORD (from a secret)}"
: "${MLFLOW_ARTIFACTS_DESTINATION:?set MLFLOW_ARTIFACTS_DESTINATION, e.g. s3://BUCKET/mlflow}"

urlquote() { python -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$1"; }
# The driver by name: SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3, and the image
# installs psycopg2 (tests/test_postgres.py runs MLflow on PostgreSQL with this URI form).
server="postgresql+psycopg2://$(urlquote "$POSTGRES_USER"):$(urlquote "$POSTGRES_PASSWORD")@${POSTGRES_HOST}:${POSTGRES_PORT:-5432}"

# MLflow reads the backend store from the environment (not from argv).
export MLFLOW_BACKEND_STORE_URI="$server/${POSTGRES_DB:-mlflow}"

# The auth app's settings file, private to this container; '%' doubled for configparser.
conf_dir="$(mktemp -d)"
chmod 700 "$conf_dir"
auth_db="$server/${MLFLOW_AUTH_DB:-mlflow_auth}"
(
  umask 077
  cat > "$conf_dir/basic_auth.ini" <<INI
[mlflow]
default_permission = ${MLFLOW_AUTH_DEFAULT_PERMISSION:-EDIT}
database_uri = ${auth_db//%/%%}
admin_username = ${MLFLOW_AUTH_ADMIN_USERNAME:-admin}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
INI
)
export MLFLOW_AUTH_CONFIG_PATH="$conf_dir/basic_auth.ini"

args=(server --app-name basic-auth --host 0.0.0.0 --port "${MLFLOW_PORT:-5000}"
      --workers "${MLFLOW_WORKERS:-4}" --serve-artifacts
      --artifacts-destination "$MLFLOW_ARTIFACTS_DESTINATION")
exec mlflow "${args[@]}"
