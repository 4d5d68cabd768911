"""The training script as a job: `python -m kit.mnist.train` on n local workers (horovodrun --gloo or mpirun), its
environment, and paired 1- vs n-worker throughput runs of it (`kit.bench mnist`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kit import env
from kit.env import MPI_ENV
from kit.mnist.throughput import paired_runs

REPO = Path(env.KIT_ROOT).resolve()   # the folder that holds the `kit` package: the jobs' working directory
TRAIN = ("-m", "kit.mnist.train")   # the training script, as `python -m kit.mnist.train`
TRAIN_FILE = Path(__file__).with_name("train.py")   # its source (notebook 04 prints a part of it)


def launch_env(**extra) -> dict:
    """Return the environment for horovodrun/mpirun children: the venv's bin on PATH; Open MPI allowed as root."""
    out = {**os.environ, **env.FRAMEWORK_ENV, **MPI_ENV, "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    out.update({k: str(v) for k, v in extra.items()})
    return out


SETTINGS = {   # what each worker gets; "one compute thread per worker" needs more than intra-op = 1
    "tf_defaults": ["--threads", "1"],                                         # TF's inter-op pool, no pinning
    "pinned": ["--threads", "1", "--inter-op-threads", "1", "--pin"],          # 1 thread, 1 core per worker
}


def run_script(n: int, args: list[str], launcher: str = "gloo", env: dict | None = None, timeout: float = 1800):
    """Run kit.mnist.train on n local workers (horovodrun --gloo or mpirun); return rank 0's JSON."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "result.json"
        bin_ = Path(sys.executable).parent
        if launcher == "gloo":
            cmd = [str(bin_ / "horovodrun"), "--gloo", "-np", str(n), "-H", f"localhost:{n}"]
        else:
            cmd = [str(bin_ / "mpirun"), "--oversubscribe", "-np", str(n)]
        cmd += [sys.executable, *TRAIN, *args, "--json", str(out)]
        p = subprocess.run(cmd, env=launch_env(**(env or {})), capture_output=True, text=True, timeout=timeout,
                           cwd=REPO)
        if p.returncode or not out.exists():
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        return json.loads(out.read_text())


def paired_throughput(args: list[str], repeats: int, steps: int, n: int = 2, launcher: str = "gloo",
                      env: dict | None = None) -> dict:
    """paired_runs of kit.mnist.train: 1 worker, then n workers under `launcher` (with `env`)."""
    synthetic = ["--synthetic-steps", str(steps), *args]
    out = paired_runs(lambda: run_script(1, synthetic, launcher, env), lambda: run_script(n, synthetic, launcher, env),
                      repeats, n)
    return {"args": args, "launcher": launcher, "env": env or {}, "steps": steps, **out}
