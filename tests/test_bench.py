"""kit.bench: a smoke run of the `ps` and `allreduce` benchmarks at their tiny size, into a temporary folder."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

KIT = Path(__file__).resolve().parent.parent / "kit"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name,figures,keys", [
    ("ps", ["ps.png", "ps_model.png", "ps_extrapolation.png"], ["pingpong", "training", "exchange", "bytes_exact"]),
    ("allreduce", ["allreduce.png", "allreduce_model.png", "allreduce_fusion.png"],
     ["records", "model_points", "all_correct"]),
])
def test_tiny_benchmark_writes_json_figures_and_a_summary(tmp_path, no_leaks, name, figures, keys):
    env = {**os.environ, "PYTHONPATH": str(KIT.parent)}
    done = subprocess.run([sys.executable, "-m", "kit.bench", name, "--tiny", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=220, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((tmp_path / f"{name}.json").read_text())
    assert doc["benchmark"] == name and doc["tiny"] is True and all(k in doc for k in keys)
    assert doc.get("bytes_exact", True) and doc.get("all_correct", True)   # the measured runs were right
    for f in figures:
        assert (tmp_path / f).stat().st_size > 1000, f
    assert done.stdout.strip().splitlines()[-1] == doc["summary"]         # the one-line summary, printed last


def test_no_kit_module_switches_the_matplotlib_backend():
    """Notebooks show, benchmarks save on a Figure without pyplot: no module of kit switches the backend."""
    calls = {str(p.relative_to(KIT)): re.findall(r"matplotlib\.use\(|plt\.switch_backend\(", p.read_text())
             for p in KIT.rglob("*.py")}
    assert len(calls) > 30
    assert not {name: c for name, c in calls.items() if c}


def test_the_gpu_benchmark_refuses_cleanly_without_a_gpu(tmp_path):
    """`python -m kit.bench gpu` on a CPU machine: one line saying where to run it, no traceback, no JSON."""
    env = {**os.environ, "PYTHONPATH": str(KIT.parent), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "kit.bench", "gpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "no CUDA GPU" in done.stderr and "GPU host" in done.stderr
    assert not (tmp_path / "gpu.json").exists()
