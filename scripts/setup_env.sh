#!/usr/bin/env bash
# Create .venv (if missing) with every pinned package and a working Horovod. Idempotent and fast when done:
# a stamp in the venv records a hash of everything that defines the environment.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-.venv}
PYTHON_BOOT=${PYTHON_BOOT:-python3}

"$PYTHON_BOOT" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' 2>/dev/null \
  || { echo "setup_env: ERROR: Python >= 3.10 is needed ($PYTHON_BOOT is $("$PYTHON_BOOT" --version 2>&1))." >&2
       echo "           Install one and run: make PYTHON_BOOT=python3.11 test" >&2; exit 1; }

stamp=$(cat pyproject.toml scripts/setup_env.sh scripts/install_horovod.sh scripts/horovod-*.patch \
        | sha256sum | cut -c1-16)
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.kit-stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "setup_env: $VENV is up to date"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup_env: creating $VENV"
  "$PYTHON_BOOT" -m venv "$VENV" || { echo "setup_env: ERROR: 'python3 -m venv' failed; on Debian/Ubuntu: apt install python3-venv" >&2; exit 1; }
fi
log="$VENV/pip-install.log"
pip_install() {  # quiet unless it fails; then the log's tail says why
  "$VENV/bin/python" -m pip install "$@" >"$log" 2>&1 \
    || { tail -n 40 "$log" >&2; echo "setup_env: ERROR: pip install $* failed (log: $log)" >&2; exit 1; }
}
pip_install --upgrade pip
echo "setup_env: installing the pinned packages (pyproject.toml; ~1 GB of wheels the first time)"
pip_install -e .
PYTHON="$VENV/bin/python" bash scripts/install_horovod.sh
echo "$stamp" >"$VENV/.kit-stamp"
echo "setup_env: $VENV ready"
