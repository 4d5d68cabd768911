"""kit.netlab.network_run: notebooks 02 and 03's lab section runs the exchange on a fresh lab where one can start,
else reads the committed run and says why (the lab and the experiment stood in for here: nothing starts)."""
import json
import os

import matplotlib

from kit.netlab import network_run

matplotlib.use("Agg")


def test_without_a_lab_the_committed_run_and_the_reason(monkeypatch, capsys):
    monkeypatch.setattr(network_run, "why_not", lambda: "kit.netlab needs root")
    monkeypatch.setattr(network_run.exchange, "experiment", lambda **kw: 1 / 0)      # must not run
    net, no_lab = network_run.fresh_or_committed(ns=(2, 3), sizes=(4096,), rate="1gbit", reps=1, impls=("ring",))
    with open(os.path.join(network_run.RESULTS, "network.json")) as f:
        assert net == json.load(f)
    assert no_lab == "kit.netlab needs root"
    out = capsys.readouterr().out
    assert "No lab on this machine: kit.netlab needs root." in out
    assert f"every sum correct: {all(r['ok'] for r in net['rows'])}" in out and "load average" in out


def test_with_a_lab_the_fresh_run_with_its_arguments_plotted(monkeypatch, capsys):
    calls = {}
    fresh = {"rows": [{"ok": True}, {"ok": False}]}
    monkeypatch.setattr(network_run, "why_not", lambda: None)
    monkeypatch.setattr(network_run.exchange, "experiment", lambda **kw: calls.setdefault("run", kw) and fresh)
    monkeypatch.setattr(network_run.network_plots, "plot_network", lambda x, K: calls.setdefault("plot", (x, K)))
    net, no_lab = network_run.fresh_or_committed(ns=(2, 3), sizes=(4096, 1 << 20), rate="1gbit", reps=2,
                                                 impls=("ps", "ring"), link_rounds=2)
    assert (net, no_lab) == (fresh, None)
    assert calls["run"] == {"ns": (2, 3), "sizes": (4096, 1 << 20), "rate": "1gbit", "reps": 2, "impls": ("ps", "ring"),
                            "link_rounds": 2}
    assert calls["plot"] == (fresh, 1 << 20)
    assert "every sum correct: False" in capsys.readouterr().out


def test_the_benchmark_page_renders_this_run_and_runs_from_before_the_one_link_measurement():
    from kit.plots.network import readme_tables
    with open(os.path.join(network_run.RESULTS, "network.json")) as f:
        x = json.load(f)
    K = max(x["sizes"])
    page = readme_tables(x, K, small_reps=30)
    assert "3 timed calls per point (4 KB: 30)." in page and "| α ping-pong (µs) | α bare socket (µs) |" in page
    assert "At K = 4 KB, median of 30 calls; α = " in page and "| ring / 2(N−1) (µs) | (N−2)·α > (N−1)·o |" in page
    old = {k: v for k, v in x.items() if k not in ("link", "latency")}              # a run before 2026-12-06
    page = readme_tables(old, K)
    assert "| N | α (µs) | B ping-pong (MB/s) |" in page and "bare socket" not in page and "At K = 4 KB" not in page
    no_socket = {**x, "link": {k: v for k, v in x["link"].items() if not k.startswith("socket")}}
    page = readme_tables(no_socket, K)
    assert "| not measured |" in page and "the link's own latency" not in page
