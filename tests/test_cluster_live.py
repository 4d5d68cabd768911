"""A notebook's start cell run again replaces its cluster (kit.cluster.live, issue 50): in IPython, a live cluster
of the same kind is stopped with a notice; other kinds, and clusters outside IPython, are left alone. Stand-ins for
clusters: no process is started."""
from kit.cluster import live


class Stub:
    def __init__(self, kind, n=2):
        self.kind, self.kind_text, self.started_at, self.n, self.stopped = kind, f"{kind}", "07:00:00", n, False

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
    again = Stub(("gloo", "local"), n=4)
    assert live.replace_same_kind(again, interactive=False) == [] and not gloo.stopped   # a script: both may run
    assert live.replace_same_kind(again, interactive=True) == [gloo]
    assert gloo.stopped and not mpi.stopped and not lab.stopped and live.live() == [mpi, lab]
    err = capsys.readouterr().err
    assert "kit.cluster: stopping <kit.cluster.Cluster n=2 backend='gloo' running>, started by this kernel at " \
           "07:00:00 and not stopped: a start cell run again replaces its cluster of the same kind" in err
