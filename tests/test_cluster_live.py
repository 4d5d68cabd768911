"""A notebook's start cell run again replaces its cluster (kit.cluster.live, issue 50): a live cluster of the same
kind that a cell started is stopped with a notice; other kinds, and clusters started inside functions, scripts or
tests, are left alone. Stand-ins for clusters and for IPython: no process is started."""
import types

import IPython

from kit.cluster import live


class Stub:
    def __init__(self, kind, n=2):
        self.kind, self.kind_text, self.started_at, self.n, self.stopped = kind, f"{kind}", "07:00:00", n, False
        self.from_cell = True

    def stop(self):
        self.stopped = True
        live.discard(self)

    def __repr__(self):
        return f"<kit.cluster.Cluster n={self.n} backend={self.kind[0]!r} running>"


def test_a_start_cell_run_again_stops_the_clusters_of_its_kind_and_says_so(capsys, monkeypatch):
    monkeypatch.setattr(live, "_LIVE", [])
    gloo, mpi, lab = Stub(("gloo", "local")), Stub(("mpi", "local")), Stub(("gloo", (("h1", 2), ("h2", 2))))
    for c in (gloo, mpi, lab):
        live.add(c)
    inner = Stub(("gloo", "local"), n=3)
    inner.from_cell = False                               # e.g. kit.ddp.experiment() starting its own cluster
    assert live.replace_same_kind(inner) == [] and not gloo.stopped
    live.add(inner)
    again = Stub(("gloo", "local"), n=4)
    assert live.replace_same_kind(again) == [gloo]
    assert gloo.stopped and not mpi.stopped and not lab.stopped and not inner.stopped
    assert live.live() == [mpi, lab, inner]
    err = capsys.readouterr().err
    assert "kit.cluster: stopping <kit.cluster.Cluster n=2 backend='gloo' running>, started by this kernel at " \
           "07:00:00 and not stopped: a start cell run again replaces its cluster of the same kind" in err


def test_only_a_cells_own_call_counts_as_started_from_a_cell(monkeypatch):
    cell = {"live": live}
    monkeypatch.setattr(IPython, "get_ipython", lambda: types.SimpleNamespace(user_global_ns=cell))
    exec("def start():\n    return live.called_from_cell()\nfrom_cell = start()", cell)   # a cell calls start
    assert cell["from_cell"] is True

    def start():                                         # a function of a module calls start
        return live.called_from_cell()
    assert start() is False
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    exec("def start():\n    return live.called_from_cell()\nfrom_cell = start()", cell)   # no IPython at all
    assert cell["from_cell"] is False


class View:
    def __init__(self, registry):
        self.registry = registry

    def activate(self):                                   # what ipyparallel's View.activate does: new magics
        self.registry["ParallelMagics"] = types.SimpleNamespace(view=self)


def test_when_the_cluster_px_targets_stops_px_targets_the_newest_live_one_again(monkeypatch):
    """Notebook 05: its lab section's `with kit.cluster.start(..., hosts=lab)` took %%px; after the block the
    notebook's own cluster must have it back, not the stopped one (ClusterStoppedError in the next %%px cell)."""
    registry = {}
    shell = types.SimpleNamespace(magics_manager=types.SimpleNamespace(registry=registry))
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    monkeypatch.setattr(live, "_LIVE", [])
    main, other, inner = Stub(("gloo", "local")), Stub(("mpi", "local")), Stub(("gloo", (("h1", 1),)))
    for c in (main, other, inner):
        c._view = View(registry)
        live.add(c)
        c._view.activate()                                # each start activates its view
    other.stop()                                          # %%px is not on it: nothing changes
    assert registry["ParallelMagics"].view is inner._view
    inner.stop()
    assert registry["ParallelMagics"].view is main._view  # the newest live cluster's view again
    main.stop()                                           # none left: %%px keeps the stopped view (it refuses)
    assert registry["ParallelMagics"].view is main._view
