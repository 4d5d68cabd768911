#!/usr/bin/env bash
# Start JupyterLab in notebooks/ and print its URL (with token). Binds 127.0.0.1 unless LAB_IP says otherwise
# (Dockerfile.gpu sets LAB_IP=0.0.0.0 inside the container; publish it with -p 127.0.0.1:8888:8888).
# The token reaches the server through its environment (JUPYTER_TOKEN, readable by you and root only), never its
# command line: every local user can read /proc/PID/cmdline. As root, JupyterLab needs --allow-root (docs/netlab.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-.venv}
port=${LAB_PORT:-8888}
ip=${LAB_IP:-127.0.0.1}
JUPYTER_TOKEN=${JUPYTER_TOKEN:-$("$VENV/bin/python" -c 'import secrets; print(secrets.token_hex(24))')}
export JUPYTER_TOKEN TF_USE_LEGACY_KERAS=1
root_flag=()
[ "$(id -u)" = 0 ] && root_flag=(--allow-root)
host=$ip; [ "$ip" = 0.0.0.0 ] && host=127.0.0.1
echo "JupyterLab: http://$host:$port/lab?token=$JUPYTER_TOKEN"
echo "(Ctrl-C to stop; the kernels' engines stop with them)"
exec "$VENV/bin/jupyter" lab --no-browser --ip="$ip" --port="$port" --ServerApp.port_retries=0 \
  --ServerApp.root_dir=notebooks "${root_flag[@]}"
