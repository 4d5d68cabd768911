#!/usr/bin/env bash
# Create .venv (if missing) with every pinned package and a working Horovod. Idempotent and fast when done:
# a stamp in the venv records a hash of everything that defines the environment (the PyTorch choice included).
#
#   TORCH=auto|cpu|cuda   which PyTorch build (default auto: CUDA when an NVIDIA GPU is present, else CPU)
#   TORCH_INDEX=URL       take that build from this index (e.g. https://download.pytorch.org/whl/cu128)
#   HOROVOD_GPU_OPERATIONS=NCCL   build Horovod with NCCL (needs a CUDA toolkit; Dockerfile.gpu sets it)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-.venv}
PYTHON_BOOT=${PYTHON_BOOT:-python3}
TORCH=${TORCH:-auto}
TORCH_INDEX=${TORCH_INDEX:-}
TORCH_CPU_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

say() { echo "setup_env: $*"; }
die() { echo "setup_env: ERROR: $*" >&2; exit 1; }

"$PYTHON_BOOT" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' 2>/dev/null \
  || die "Python >= 3.11 is needed ($PYTHON_BOOT is $("$PYTHON_BOOT" --version 2>&1)).
           Install one and run: make PYTHON_BOOT=python3.11 test"

# --- which PyTorch, and why -------------------------------------------------------------------------------
has_gpu() { nvidia-smi -L 2>/dev/null | grep -q '^GPU' || compgen -G '/proc/driver/nvidia/gpus/*' >/dev/null; }
case "$TORCH" in
  auto) if has_gpu; then want=cuda; why="an NVIDIA GPU is present"
        else want=cpu; why="no NVIDIA GPU found"; fi ;;
  cpu|cuda) want=$TORCH; why="TORCH=$TORCH was asked for" ;;
  *) die "TORCH must be auto, cpu or cuda (got '$TORCH'), e.g. make TORCH=cpu setup" ;;
esac

stamp=$( (cat pyproject.toml scripts/setup_env.sh scripts/install_horovod.sh scripts/horovod-*.patch; echo "torch=$want ${TORCH_INDEX:-} gpu_ops=${HOROVOD_GPU_OPERATIONS:-none}") \
        | sha256sum | cut -c1-16)
[ "${1:-}" = --print-stamp ] && { echo "$stamp"; exit 0; }     # tests/test_packaging.py

# --- root only: the system packages the emulated-host lab needs (kit.netlab) --------------------------------
lab_pkgs=()
[ -x /usr/sbin/sshd ] || lab_pkgs+=(openssh-server)
{ command -v ip && command -v tc && command -v ss; } >/dev/null 2>&1 || lab_pkgs+=(iproute2)
# Slurm on the lab (kit.netlab.slurm): controller, node daemon, clients and MUNGE; apt starts none of them here
{ [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ] && command -v sinfo; } >/dev/null 2>&1 \
  || lab_pkgs+=(slurmctld slurmd slurm-client munge)
# Notebook 04's 28x28 images offline: Debian's Fashion-MNIST (kit.datasets looks in /usr/share/datasets)
[ -d /usr/share/datasets/fashion-mnist ] || lab_pkgs+=(dataset-fashion-mnist)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ ${#lab_pkgs[@]} -gt 0 ]; then
  say "root: installing Debian's ${lab_pkgs[*]} for the emulated-host lab (kit.netlab) and notebook 04's data"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${lab_pkgs[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${lab_pkgs[@]}" >/dev/null; } \
    || die "apt-get install ${lab_pkgs[*]} failed (the lab needs it; the rest of the kit does not)"
fi
# headless Chromium for tests/test_jupyterlab_ui.py (notebook 00 run in JupyterLab through selenium). Debian's
# packages; where apt has none that work (Ubuntu ships snap stubs) warn and go on: only that test needs them.
ui_pkgs=()
{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || ui_pkgs+=(chromium chromium-driver)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ ${#ui_pkgs[@]} -gt 0 ]; then
  say "root: installing Debian's ${ui_pkgs[*]} for the JupyterLab browser test"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${ui_pkgs[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${ui_pkgs[@]}" >/dev/null 2>&1; } \
    || say "WARNING: apt-get install ${ui_pkgs[*]} failed: tests/test_jupyterlab_ui.py fails until they are installed" >&2
fi

if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.kit-stamp" 2>/dev/null)" = "$stamp" ]; then
  say "$VENV is up to date (PyTorch: $(cat "$VENV/.kit-torch" 2>/dev/null || echo "$want build"))"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON_BOOT" -m venv "$VENV" || die "'$PYTHON_BOOT -m venv' failed; on Debian/Ubuntu: apt install python3-venv"
fi
PY="$VENV/bin/python"
log="$VENV/pip-install.log"
pip_install() {  # quiet unless it fails; then the log's tail says why
  "$PY" -m pip install "$@" >"$log" 2>&1 \
    || { tail -n 40 "$log" >&2; die "pip install $* failed (log: $log)"; }
}
pip_install --upgrade pip

torch_pin=$(grep -oE '"torch==[^"]+"' pyproject.toml | tr -d '"')
installed=$("$PY" - 2>/dev/null <<'PY' || true
import importlib.metadata as md, importlib.util as u
if u.find_spec("torch"):
    import torch
    print(torch.__version__, "cuda" if torch.version.cuda else "cpu")
PY
)
cpu_index_ok() { "$PY" -c "import urllib.request as r, sys; r.urlopen(sys.argv[1] + '/torch/', timeout=15)" "$TORCH_CPU_INDEX" 2>/dev/null; }
pip_torch_url() {  # where plain pip would take torch from (a CPU wheel may be on this machine's find-links)
  "$PY" -m pip install --dry-run --quiet --no-deps --ignore-installed --report - "$torch_pin" 2>/dev/null \
    | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["install"][0]["download_info"]["url"])' 2>/dev/null || true
}
# A fallback CUDA build stays while no CPU build can be had: an update must not download its 2.5 GB again.
if [ -n "$installed" ] && [ "$want" = cpu ] && [ "${installed#* }" = cuda ] && ! cpu_index_ok \
   && ! pip_torch_url | grep -qE '%2Bcpu|\+cpu'; then
  say "keeping the installed PyTorch (${installed% *}, CUDA build): PyTorch's CPU index still cannot be reached"
elif [ -n "$installed" ] && [ "${installed#* }" != "$want" ]; then
  say "replacing the installed PyTorch (${installed% *}, ${installed#* } build) by the $want build"
  "$PY" -m pip uninstall -y -q torch
  installed=""
fi
if [ -z "$installed" ]; then
  if [ "$want" = cpu ]; then
    if cpu_index_ok; then
      say "PyTorch: the CPU build ($why), from PyTorch's CPU index $TORCH_CPU_INDEX (192 MB)"
      pip_install "$torch_pin" --index-url "$TORCH_CPU_INDEX"
    else
      url=$(pip_torch_url)
      case "$url" in
        *%2Bcpu*|*+cpu*)
          say "PyTorch: the CPU build ($why); PyTorch's CPU index $TORCH_CPU_INDEX cannot be reached, but your pip configuration offers a CPU wheel: $(basename "${url//%2B/+}")" ;;
        *)
          say "PyTorch: $why, but PyTorch's CPU index $TORCH_CPU_INDEX cannot be reached from here."
          say "  Falling back to PyPI's $torch_pin, which on Linux x86_64 is the CUDA build: ~2.5 GB more to download"
          say "  and ~7 GB in $VENV. It runs on the CPU all the same; Horovod's PyTorch ops are then built for CPU"
          say "  tensors. For the small CPU build, make that index reachable (or give TORCH_INDEX=<a mirror of it>)." ;;
      esac
      pip_install "$torch_pin"
    fi
  elif [ -n "$TORCH_INDEX" ]; then
    say "PyTorch: the CUDA build ($why), from $TORCH_INDEX"
    pip_install "$torch_pin" --index-url "$TORCH_INDEX"
  else
    say "PyTorch: the CUDA build ($why), PyPI's default $torch_pin wheel with its nvidia-* packages (~2.7 GB)"
    pip_install "$torch_pin"
  fi
fi
got=$("$PY" -c 'import torch; print(torch.__version__, "CUDA " + torch.version.cuda if torch.version.cuda else "CPU")' 2>/dev/null)
say "PyTorch installed: ${got%% *} (${got#* } build)"
echo "${got%% *} (${got#* } build)" >"$VENV/.kit-torch"     # what the next up-to-date check reports
if [ "$want" = cuda ] && [ "${got#* }" = CPU ]; then
  say "  note: TORCH=cuda but pip chose a CPU wheel (your pip configuration offers one): GPU tensors won't work"
fi

say "installing the pinned packages (pyproject.toml; ~0.75 GB of wheels besides torch the first time, TensorFlow 572 MB of it)"
pip_install -e .
PYTHON="$PY" bash scripts/install_horovod.sh
echo "$stamp" >"$VENV/.kit-stamp"
say "$VENV ready"
