"""kit.mnist.lab without a lab: the lesson's check (notebook 04's lab section calls it on its live run under
`make test`, as root) on the committed benchmark run and on runs that break a claim; the CNN's gradient bytes;
`python -m kit.bench mnist_lab` writing its JSON, figure and one-line summary (the lab runs replaced by the
committed ones: notebook 04 runs them for real)."""
import copy
import json
from pathlib import Path

import pytest

from kit.mnist import lab as mnist_lab

REPO = Path(__file__).resolve().parent.parent
COMMITTED = json.loads((REPO / "results" / "mnist_lab.json").read_text())
# the classic CNN's weights: conv 3x3x1->32, conv 3x3x32->64, dense 9216->128, dense 128->10 (with biases)
PARAMS = (9 * 32 + 32) + (9 * 32 * 64 + 64) + (9216 * 128 + 128) + (128 * 10 + 10)


def test_the_gradients_are_the_cnns_weights_in_float32():
    assert mnist_lab.gradient_bytes() == 4 * PARAMS == COMMITTED["gradient_bytes"]
    assert mnist_lab.ring_seconds(2, 4 * PARAMS, "1gbit") == pytest.approx(2 * (2 - 1) / 2 * 4 * PARAMS * 8 / 1e9)
    # the wire's time equals one worker's step at the crossover rate
    assert mnist_lab.crossover_rate(COMMITTED) / 8 * COMMITTED["one_worker"]["step_s"] == pytest.approx(4 * PARAMS)


def test_the_check_passes_the_committed_run_and_names_what_a_broken_one_breaks():
    mnist_lab.check(COMMITTED)
    bad = copy.deepcopy(COMMITTED)
    r = bad["runs"][0]
    r["allreduce_s"] = 0.5 * r["link_s"]                   # faster than the wire allows
    bad["runs"][1]["speedup"] *= 2                        # not samples/s over one worker's
    bad["runs"][2]["cores_busy"] = bad["runs"][2]["cores_busy"][:1]
    with pytest.raises(AssertionError) as e:
        mnist_lab.check(bad)
    msg = str(e.value)
    assert f"{r['n']} hosts at {r['rate']}: the allreduce took" in msg and "share or speed-up" in msg
    assert "1 workers reported their cores" in msg and msg.count("\n- ") == 4   # shares follow too: 4 claims


def test_the_benchmark_writes_json_figure_and_summary(tmp_path, monkeypatch, capsys):
    from contextlib import nullcontext

    from kit.bench import main as bench_cli
    from kit.bench import mnist_lab as bench_mnist_lab
    asked = {}
    monkeypatch.setattr(bench_mnist_lab.netlab, "start", lambda **kw: asked.update(kw) or nullcontext("lab"))
    runs = {k: v for k, v in COMMITTED.items() if k != "summary"}          # the summary is the benchmark's own
    monkeypatch.setattr(bench_mnist_lab.lab_runs, "scaling", lambda lab, *a: asked.update(args=a) or runs)
    bench_cli(["mnist_lab", "--tiny", "--out", str(tmp_path)])
    assert asked == {"hosts": 2, "rate": "1gbit", "args": ((2,), ("1gbit",), 12)}       # the tiny settings
    doc = json.loads((tmp_path / "mnist_lab.json").read_text())
    assert doc["runs"] == COMMITTED["runs"] and (tmp_path / "mnist_lab.png").stat().st_size > 1000
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == doc["summary"] and f"{COMMITTED['runs'][0]['speedup']:.2f}x" in out[-1]
    table = mnist_lab.table(doc)
    assert table.count("\n") == 2 + len(doc["runs"]) and f"{doc['runs'][0]['speedup']:.2f}×" in table
