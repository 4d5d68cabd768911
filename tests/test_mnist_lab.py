"""kit.mnist.lab through `python -m kit.bench mnist_lab --tiny`: notebook 04's MNIST job on 2 lab hosts at 1 Gbit/s.
The job runs, the timeline's exchange per step is there and no faster than the wire allows, the model's numbers
follow from the CNN's size, and the JSON, figure and summary line are written.

Needs root (kit.netlab makes network namespaces): skipped without it; CI runs as root.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.mnist import lab as mnist_lab

REPO = Path(__file__).resolve().parent.parent
# the classic CNN's weights: conv 3x3x1->32, conv 3x3x32->64, dense 9216->128, dense 128->10 (with biases)
PARAMS = (9 * 32 + 32) + (9 * 32 * 64 + 64) + (9216 * 128 + 128) + (128 * 10 + 10)


@pytest.mark.timeout(600)
@pytest.mark.requires_root
def test_the_mnist_job_on_two_lab_hosts(tmp_path, no_leaks):
    done = subprocess.run([sys.executable, "-m", "kit.bench", "mnist_lab", "--tiny", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=560, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    doc = json.loads((tmp_path / "mnist_lab.json").read_text())
    assert doc["gradient_bytes"] == 4 * PARAMS
    (run,) = doc["runs"]
    assert (run["n"], run["rate"]) == (2, "1gbit")
    assert run["link_s"] == pytest.approx(2 * (2 - 1) / 2 * 4 * PARAMS * 8 / 1e9)   # 2(N-1)/N K / B
    # the gradients crossed a 1 Gbit/s link every step: the transfer cannot beat it (tbf's 2 ms burst aside)
    assert 0.8 * run["link_s"] < run["allreduce_s"] < run["step_s"]
    assert run["allreduce_share"] == pytest.approx(run["allreduce_s"] / run["step_s"])
    one = doc["one_worker"]
    assert one["n"] == 1 and one["allreduce_s"] == 0 and one["samples_per_s"] > 0
    assert run["speedup"] == pytest.approx(run["samples_per_s"] / one["samples_per_s"])
    assert len(run["cores_busy"]) == 2 and len(one["cores_busy"]) == 1
    assert (tmp_path / "mnist_lab.png").stat().st_size > 1000
    assert done.stdout.strip().splitlines()[-1] == doc["summary"]
    table = mnist_lab.table(doc)
    assert table.count("\n") == 3 and f"{run['speedup']:.2f}×" in table
    # the wire's time equals one worker's step at the crossover rate
    assert mnist_lab.crossover_rate(doc) / 8 * one["step_s"] == pytest.approx(4 * PARAMS)
