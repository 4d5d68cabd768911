#!/usr/bin/env bash
# Start JupyterLab in notebooks/ and print its URL (with token). Binds 127.0.0.1 unless LAB_IP says otherwise
# (Dockerfile.gpu sets LAB_IP=0.0.0.0 inside the container; publish it with -p 127.0.0.1:8888:8888).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-.venv}
port=${LAB_PORT:-8888}
ip=${LAB_IP:-127.0.0.1}
token=${JUPYTER_TOKEN:-$("$VENV/bin/python" -c 'import secrets; print(secrets.token_hex(24))')}
root_flag=()
[ "$(id -u)" = 0 ] && root_flag=(--allow-root)
host=$ip; [ "$ip" = 0.0.0.0 ] && host=127.0.0.1
echo "JupyterLab: http://$host:$port/lab?token=$token"
echo "(Ctrl-C to stop; the kernels' engines stop with them)"
exec env TF_USE_LEGACY_KERAS=1 "$VENV/bin/jupyter" lab --no-browser --ip="$ip" --port="$port" \
  --ServerApp.port_retries=0 --IdentityProvider.token="$token" --ServerApp.root_dir=notebooks "${root_flag[@]}"
