#!/usr/bin/env bash
# The fresh-machine check (CI runs it as root after `make test`): does the kit install and run for a plain user
# with plain PyPI? A throwaway non-root user, a login shell (none of root's PIP_* variables or pip config), a
# fresh clone of this repository's HEAD, then `make setup`, notebook 00 and the cluster tests (engines as a
# non-root user: no Open MPI allow-run-as-root variables), or with KIT_CI_FULL=1 the whole `make test` (the
# lab's tests skip, saying they need root), and `make lab` answering on 127.0.0.1.
#
#   sudo bash scripts/ci_fresh_user.sh           # ~20 min on 2 cores, most of it downloads and the Horovod build
#   sudo KIT_CI_FULL=1 bash scripts/ci_fresh_user.sh     # + the whole suite as that user (~30 min more)
#
# Cost: the user's pip downloads ~3.5 GB (PyTorch's CPU index is unreachable here, so PyPI's CUDA torch; see
# docs/install.md "Which PyTorch"), then Horovod is built (10 min of CPU, 5-10 min on 2 cores): ~20 min in all. The
# user's pip cache and Horovod wheel cache are kept between runs (in $KIT_CI_CACHE, default /var/cache/kit-ci),
# to keep CI inside its 90 minutes: this machine's index sends no cache headers, so pip caches little and each
# run downloads again; the Horovod wheel is relocatable (install_horovod.sh) and is rebuilt whenever its key
# changes (versions, patch) or it fails its check. `rm -rf /var/cache/kit-ci` makes the next run build it from
# scratch, as a fresh machine does. Everything else (user, home, processes) is removed at the end.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "ci_fresh_user: must run as root (it creates and removes a user)" >&2; exit 2; }
user=kitci$$
home=/home/$user
keep=${KIT_CI_CACHE:-/var/cache/kit-ci}/pip
keep_hvd=${KIT_CI_CACHE:-/var/cache/kit-ci}/horovod
t0=$(date +%s)

cleanup() {
  set +e
  pkill -KILL -u "$user" 2>/dev/null; sleep 1
  # what the user's processes left in the shared temp dirs (a crashed pytest's session dir): userdel leaves it
  find /tmp /var/tmp /dev/shm -xdev -mindepth 1 -maxdepth 1 -user "$user" -exec rm -rf {} + 2>/dev/null
  if [ -d "$home/.cache/pip" ]; then mkdir -p "$(dirname "$keep")"; rm -rf "$keep"; mv "$home/.cache/pip" "$keep"; fi
  if [ -d "$home/.cache/kit/horovod" ]; then rm -rf "$keep_hvd"; mv "$home/.cache/kit/horovod" "$keep_hvd"; fi
  userdel -r "$user" >/dev/null 2>&1; rm -rf "$home" "/tmp/$user-setup.log" "/tmp/$user-test.log"
  echo "ci_fresh_user: removed user $user and its home ($(( $(date +%s) - t0 )) s in all)"
}
trap cleanup EXIT

useradd -m -s /bin/bash "$user"
git clone --quiet "$repo" "$home/kit"
if [ -d "$keep" ]; then mkdir -p "$home/.cache"; mv "$keep" "$home/.cache/pip"; fi
if [ -d "$keep_hvd" ]; then mkdir -p "$home/.cache/kit"; mv "$keep_hvd" "$home/.cache/kit/horovod"; fi
chown -R "$user": "$home"

as_user() { su - "$user" -c "$1"; }    # a login shell: the user's own, plain environment
echo "ci_fresh_user: as $user (uid $(id -u "$user")), HOME=$home, PIP_* variables: $(as_user 'env | grep -c ^PIP_' || true)"
as_user 'cd ~/kit && make setup' | tee "/tmp/$user-setup.log"
grep -q '^setup_env: PyTorch: ' "/tmp/$user-setup.log" \
  || { echo "ci_fresh_user: FAIL: make setup did not say which PyTorch it chose" >&2; exit 1; }
rm -f "/tmp/$user-setup.log"
as_user 'du -sh ~/kit/.venv ~/.cache/pip 2>/dev/null | sed "s|$HOME|~|"'
# The tests as that user. KIT_CI_FULL=1: the whole `make test` (issue 16's acceptance; the root-only lab tests
# skip, saying they need root; ~30 min more). Default, to keep CI inside its budget: notebook 00 (2-engine gloo
# and mpi jobs with Horovod, torch.distributed and Keras), the cluster's 4-engine gloo and mpi jobs (the rest of
# tests/test_cluster.py runs in root's `make test`; here what matters is that a plain user's engines and jobs
# start at all), and
# tests/test_kit.py (with PyPI's CUDA torch comes Triton, which segfaulted when loaded after TensorFlow: tensorflow/tensorflow#124205).
if [ "${KIT_CI_FULL:-0}" = 1 ]; then
  as_user 'cd ~/kit && make test PYTEST_ARGS="-rs"' | tee "/tmp/$user-test.log"
  grep -E "^SKIPPED" "/tmp/$user-test.log" | grep -v -i "root" \
    && { echo "ci_fresh_user: FAIL: a test skipped for a reason other than needing root (above)" >&2; exit 1; }
  rm -f "/tmp/$user-test.log"
else
  job=tests/test_cluster.py::test_one_job_of_four_for_horovod_torch_keras_and_torch_distributed_on_loopback
  as_user "cd ~/kit && .venv/bin/python -m pytest -p no:cacheprovider -q --nbval-lax --nbval-current-env \
           notebooks/00_environment.ipynb tests/test_kit.py '$job[gloo]' '$job[mpi]'"
fi

# make lab as that user: it must start and answer on 127.0.0.1, then stop with nothing left
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_user "cd ~/kit && JUPYTER_TOKEN=ci make lab LAB_PORT=$port >/dev/null 2>&1 & echo \$! > ~/lab.pid"
for _ in $(seq 60); do
  curl -fs "http://127.0.0.1:$port/api/status?token=ci" >/dev/null 2>&1 && break; sleep 2
done
curl -fs "http://127.0.0.1:$port/api/status?token=ci" >/dev/null \
  || { echo "ci_fresh_user: FAIL: make lab did not answer on 127.0.0.1:$port" >&2; exit 1; }
echo "ci_fresh_user: make lab answered on 127.0.0.1:$port"
echo "ci_fresh_user: PASS ($(( $(date +%s) - t0 )) s)"
