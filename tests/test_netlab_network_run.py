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
