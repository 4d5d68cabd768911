"""kit.bench: a smoke run of the `ps` and `allreduce` benchmarks at their tiny size, into a temporary folder."""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kit import scratch

KIT = Path(__file__).resolve().parent.parent / "kit"
# A tiny run takes 35-55 s on 2 quiet cores; beside the lab tests of the other worker the allreduce one took 134 s
# here (its engines' start alone 39 s, the MPI part 88 s), and a CI run passed 220 s: bound it at 3x that.
BOUND = 420


@pytest.mark.timeout(480)
@pytest.mark.parametrize("name,figures,keys", [
    ("ps", ["ps.png", "ps_model.png", "ps_extrapolation.png"], ["pingpong", "training", "exchange", "bytes_exact"]),
    ("allreduce", ["allreduce.png", "allreduce_model.png", "allreduce_fusion.png"],
     ["records", "model_points", "all_correct"]),
])
@pytest.mark.engines
def test_tiny_benchmark_writes_json_figures_and_a_summary(tmp_path, no_leaks, name, figures, keys):
    env = {**os.environ, "PYTHONPATH": str(KIT.parent), "PYTHONFAULTHANDLER": "1"}
    p = subprocess.Popen([sys.executable, "-m", "kit.bench", name, "--tiny", "--out", str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        out, err = p.communicate(timeout=BOUND)
    except subprocess.TimeoutExpired:   # a run that stopped moving: its progress lines and every thread's stack
        p.send_signal(signal.SIGABRT)
        out, err = p.communicate()
        scratch.sweep()                 # the engines and controller of the aborted run (their owner is gone)
        pytest.fail(f"`kit.bench {name} --tiny` ran past {BOUND} s (about 1 min quiet, 2-3 min beside a busy "
                    f"suite); its progress, then its threads' stacks:\n{err[-6000:]}")
    assert p.returncode == 0, err[-3000:]
    assert "] " + name in err                                              # progress lines on stderr
    doc = json.loads((tmp_path / f"{name}.json").read_text())
    assert doc["benchmark"] == name and doc["tiny"] is True and all(k in doc for k in keys)
    assert doc.get("bytes_exact", True) and doc.get("all_correct", True)   # the measured runs were right
    for f in figures:
        assert (tmp_path / f).stat().st_size > 1000, f
    assert out.strip().splitlines()[-1] == doc["summary"]         # the one-line summary, printed last


@pytest.mark.parametrize("argv,says", [
    (["loading", "--tiny"], "--tiny: benchmark 'loading' has no tiny setting (those with one: "),
    (["nope"], "argument name: 'nope' is not a benchmark; choose one of loading, "),
    (["ps", "--quick", "--tiny"], "--quick and --tiny: give one of them"),
    (["ps", "--out", __file__], "--out: "),
])
def test_bad_input_is_a_clear_error_naming_the_argument(capsys, argv, says):
    """`python -m kit.bench` refuses bad input before running anything: usage, then what is wrong and allowed."""
    from kit.bench import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: python -m kit.bench") and says in err, err


def test_the_ring_cpu_benchmark_renders_its_recorded_rows():
    from kit.bench.ring_cpu import summary, table
    x = json.loads((KIT.parent / "results" / "ring_cpu.json").read_text())
    assert summary(x["rows"]) == x["summary"]                          # the recorded line is what its rows say
    assert table(x).count("\n") == len(x["rows"]) + 1 and "| 8 | kit ring | 4 MB |" in table(x)


def test_no_kit_module_switches_the_matplotlib_backend():
    """Notebooks show, benchmarks save on a Figure without pyplot: no module of kit switches the backend."""
    calls = {str(p.relative_to(KIT)): re.findall(r"matplotlib\.use\(|plt\.switch_backend\(", p.read_text())
             for p in KIT.rglob("*.py")}
    assert len(calls) > 30
    assert not {name: c for name, c in calls.items() if c}


@pytest.mark.engines
def test_the_gpu_benchmark_refuses_cleanly_without_a_gpu(tmp_path):
    """`python -m kit.bench gpu` on a CPU machine: one line saying where to run it, no traceback, no JSON."""
    env = {**os.environ, "PYTHONPATH": str(KIT.parent), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "kit.bench", "gpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "no CUDA GPU" in done.stderr and "GPU host" in done.stderr
    assert not (tmp_path / "gpu.json").exists()


def test_the_time_vs_n_panel_on_log_axes_draws_every_n_of_the_committed_network_run():
    """Notebook 03's N = 2..8 figure: plot_times(log=True) on results/network.json puts one tick per N measured,
    both axes logarithmic, the two model lines and one measured series per implementation in the run."""
    from matplotlib.figure import Figure

    from kit.plots import network as netplots
    x = json.loads((KIT.parent / "results" / "network.json").read_text())
    ax = Figure().subplots()
    netplots.plot_times(x, max(x["sizes"]), ax, log=True)
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert list(ax.get_xticks()) == x["ns"] == [2, 4, 8]
    impls = {r["impl"] for r in x["rows"]} & set(netplots.STYLE)
    assert len(ax.get_lines()) == 2 + len(impls)
    for impl in impls:       # each measured series: the N and seconds of its rows at the largest size
        pts = netplots.rows(x, impl, max(x["sizes"]))
        line = next(ln for ln in ax.get_lines() if ln.get_label() == netplots.LABELS[impl])
        assert list(line.get_xdata()) == [r["N"] for r in pts]
        assert list(line.get_ydata()) == [1e3 * r["seconds"] for r in pts]
