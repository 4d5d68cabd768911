#!/usr/bin/env bash
# The air-gapped GPU check: on a GPU machine with CUDA PyTorch already installed and no internet, install what
# the GPU tests need from a wheelhouse (scripts/gpu_wheelhouse.sh) into a temporary venv that sees the machine's
# own torch, build Horovod for PyTorch only with NCCL, run the GPU tests (tests/gpu), remove everything.
#
#   bash scripts/gpu_check.sh WHEELHOUSE                 # GPU machine; ~5 min on 16 cores (Horovod build ~3)
#   KIT_GPU_CHECK_DRY_RUN=1 bash scripts/gpu_check.sh WHEELHOUSE    # CPU machine: the same steps, Horovod with
#                                                        # Gloo only, and the GPU tests must refuse cleanly
# PYTHON=python3.12 picks the interpreter that has CUDA torch. KIT_GPU_CHECK_KEEP=DIR keeps the venv there.
# KIT_GPU_CHECK_BENCH=DIR also runs `python -m kit.bench gpu --out DIR` (docs/benchmarks/gpu.md's table) before the tests.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wh=$(cd "${1:?usage: gpu_check.sh WHEELHOUSE (made by scripts/gpu_wheelhouse.sh)}" && pwd)
PY=${PYTHON:-python3}
dry=${KIT_GPU_CHECK_DRY_RUN:-0}
say() { echo "gpu_check: $*"; }
die() { echo "gpu_check: ERROR: $*" >&2; exit 1; }
t0=$(date +%s)

has_gpu() { nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }
if [ "$dry" != 1 ]; then
  has_gpu || die "no NVIDIA GPU here (nvidia-smi lists none); on a CPU machine use KIT_GPU_CHECK_DRY_RUN=1"
  "$PY" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null \
    || die "$PY has no CUDA PyTorch: install it first (this check uses the machine's own torch)"
fi
"$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch: install PyTorch first"
sdist=$(ls "$wh"/horovod-0.28.1.tar.gz 2>/dev/null) || die "$wh has no horovod-0.28.1.tar.gz"

tmp=${KIT_GPU_CHECK_KEEP:-$(mktemp -d -t kit-gpu-check.XXXXXX)}
[ -n "${KIT_GPU_CHECK_KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT
say "venv in $tmp (sees $PY's torch $("$PY" -c 'import torch; print(torch.__version__)'))"
"$PY" -m venv "$tmp/venv"
V="$tmp/venv/bin/python"
# The machine's torch (and whatever else is beside it) stays visible, after the venv's own packages: a .pth line
# naming its site-packages works whether $PY is the system Python or a venv of its own.
torch_site=$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)
echo "$torch_site" >"$("$V" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-machine-site.pth"
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$wh" PIP_DISABLE_PIP_VERSION_CHECK=1
"$V" -m pip install --quiet --ignore-installed -r "$wh/requirements.txt" || die "installing from $wh failed (wrong Python/platform?)"

# Horovod for PyTorch only. NCCL from the machine (system) or from NVIDIA's PyPI package (nvidia-nccl-cu*).
hvd_env=(KIT_FRAMEWORKS=pytorch KIT_HOROVOD_SDIST="$sdist" KIT_CACHE_DIR="$tmp/cache" PYTHON="$V"
         CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)")
if [ "$dry" != 1 ]; then
  hvd_env+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED)
  # Horovod compiles its CUDA kernels for every architecture nvcc knows unless told: build for the GPUs here
  cc=${HOROVOD_BUILD_CUDA_CC_LIST:-$("$V" -c 'import torch; print(",".join(sorted({"%d%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})))')}
  hvd_env+=(HOROVOD_BUILD_CUDA_CC_LIST="$cc")
  say "GPU: $(nvidia-smi -L | head -n1); CUDA kernels for compute capability $cc"
  nccl=$("$V" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
  if [ -n "$nccl" ] && [ -d "$nccl/include" ]; then
    mkdir -p "$tmp/nccl-lib"          # the wheel ships libnccl.so.2 only; CMake looks for libnccl.so
    ln -sf "$(ls "$nccl"/lib/libnccl.so* | head -n1)" "$tmp/nccl-lib/libnccl.so"
    libdir="$tmp/nccl-lib"
    hvd_env+=(HOROVOD_NCCL_INCLUDE="$nccl/include" HOROVOD_NCCL_LIB="$libdir")
    export LD_LIBRARY_PATH="$nccl/lib:${LD_LIBRARY_PATH:-}"
    say "NCCL from PyPI's package: $nccl"
  fi
fi
env "${hvd_env[@]}" bash "$repo/scripts/install_horovod.sh" || die "the Horovod build failed (log above)"

cd "$repo"
if [ -n "${KIT_GPU_CHECK_BENCH:-}" ] && [ "$dry" != 1 ]; then   # the GPU numbers of docs/benchmarks/gpu.md, before the tests
  say "kit.bench gpu -> $KIT_GPU_CHECK_BENCH"
  "$V" -m kit.bench gpu --out "$KIT_GPU_CHECK_BENCH" || say "kit.bench gpu failed (rc=$?); the tests still run"
fi
say "GPU tests"
set +e
KIT_TEST_GPU=1 "$V" -m pytest -p no:cacheprovider -q -rs tests/gpu 2>&1 | tee "$tmp/gpu-tests.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$dry" = 1 ]; then
  grep -q "no NVIDIA GPU" "$tmp/gpu-tests.log" && [ "$rc" != 0 ] \
    || die "dry run: the GPU tests should have refused with 'no NVIDIA GPU' (rc=$rc)"
  say "dry run OK: install + PyTorch-only Horovod build done, GPU tests refused cleanly ($(( $(date +%s) - t0 )) s)"
  exit 0
fi
say "done in $(( $(date +%s) - t0 )) s, pytest rc=$rc"
exit "$rc"
