"""kit.trace: torch.profiler traces recorded, exported as Chrome trace JSON, read back, measured (shares, gaps,
overlap), and kit.plots.trace drawing them.

Synthetic traces carry known spans, so the data-wait share and the hidden share of communication are exact; the
real traces are recorded in this process (DataLoader with num_workers=0), except one marked `engines` whose
loader starts worker processes. Timings are checked from below only (a sleep never ends early).
"""
import gzip
import json
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from kit import trace
from kit.plots import trace as plots_trace


def event(name, ts, dur, tid=1, pid=1, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "cat": cat}


def loading_trace():
    """Three steps of 100 µs; the loader takes 60, 10 and 30 µs of them: the data-wait share is exactly 1/3."""
    events = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}]
    for k, (t, wait) in enumerate([(0, 60), (100, 10), (200, 30)]):
        events += [event(f"ProfilerStep#{k + 2}", t, 100, cat="user_annotation"),
                   event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, wait,
                         cat="user_annotation"),
                   event("compute", t + wait, 100 - wait, cat="user_annotation"),
                   event("aten::conv2d", t + wait + 1, 5)]          # an op inside compute: counted once
    return {"traceEvents": events}


def test_the_data_wait_share_of_a_synthetic_trace_is_its_known_value():
    got = trace.data_wait(loading_trace())
    assert got["steps"] == 3
    assert got["wait_share"] == pytest.approx(1 / 3)
    assert got["compute_share"] == pytest.approx(2 / 3)
    assert got["wait_ms"] == pytest.approx(100 / 3 / 1e3)
    assert got["step_ms"] == pytest.approx(0.1)
    steps = trace.spans(loading_trace(), trace.STEP)
    assert trace.gaps(trace.spans(loading_trace(), trace.COMPUTE), steps) == [(0, 60), (100, 110), (200, 230)]


def test_the_hidden_share_of_communication_per_rank():
    rank0 = [event("autograd::engine::evaluate_function: AddmmBackward0", 0, 100),
             event("autograd::engine::evaluate_function: AddmmBackward0", 120, 80),
             event("autograd::engine::evaluate_function: ReluBackward0", 320, 10),
             event("gloo:all_reduce", 50, 100, tid=2), event("gloo:all_reduce", 300, 50, tid=2)]
    rank1 = [event("autograd::engine::evaluate_function: AddmmBackward0", 1000, 100),
             event("c10d::allreduce_", 1040, 5), event("gloo:all_reduce", 1200, 40, tid=3)]   # after backward
    # (the c10d:: span only launches the work, on the calling thread: not communication, kit.trace.LAUNCH)
    # rank 0: comm 150 µs, of it under backward [50,100) + [120,150) + [320,330) = 90 µs: 0.6
    assert trace.hidden(trace.spans(rank0, trace.COLLECTIVE), trace.spans(rank0, trace.BACKWARD)) == pytest.approx(0.6)
    got = trace.per_rank({0: rank0, 1: rank1})
    assert got[0]["hidden"] == pytest.approx(0.6) and got[0]["hidden_ms"] == pytest.approx(0.09)
    assert got[0]["comm_ms"] == pytest.approx(0.15) and got[0]["compute_ms"] == pytest.approx(0.19)
    assert got[1]["hidden"] == 0.0 and got[1]["comm_ms"] == pytest.approx(0.04)
    assert trace.origin([rank0, rank1]) == 0
    with pytest.raises(ValueError, match="no span matches comm"):
        trace.per_rank({0: rank0}, comm="^nccl:")


def test_intervals_union_intersect_and_gaps():
    assert trace.union([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    assert trace.length([(0, 2), (1, 3)]) == 3
    assert trace.intersect([(0, 10)], [(2, 3), (5, 20)]) == [(2, 3), (5, 10)]
    assert trace.gaps([(2, 3)], [(0, 5)]) == [(0, 2), (3, 5)]
    with pytest.raises(ValueError, match="outer spans cover no time"):
        trace.share([(0, 1)], [])


def test_device_busy_counts_kernels_and_copies():
    gpu = loading_trace()
    gpu["traceEvents"] += [event("void conv_kernel", 10, 50, tid=7, cat="kernel"),
                           event("Memcpy HtoD", 100, 20, tid=8, cat="gpu_memcpy"),
                           event("void gemm_kernel", 210, 60, tid=7, cat="kernel")]
    assert trace.device_busy(gpu) == pytest.approx(130 / 300)
    with pytest.raises(ValueError, match="no GPU kernels"):
        trace.device_busy(loading_trace())


def test_bad_traces_and_arguments_are_named():
    assert trace.invalid_events(loading_trace()) == []
    broken = {"traceEvents": [{"ph": "X", "name": "a", "ts": 0}, {"name": "no phase"}]}
    assert trace.invalid_events(broken) == ["event 0 ('a'): missing dur, pid, tid", "event 1: no 'ph'"]
    with pytest.raises(ValueError, match="traceEvents"):
        trace.load({"events": []})
    with pytest.raises(ValueError, match="active must be an integer >= 1"):
        with trace.profiler("x.json", active=0):
            pass
    with pytest.raises(ValueError, match=r"path must end in \.json or \.json\.gz"):
        with trace.profiler("x.txt"):
            pass


class SlowDataset(Dataset):
    """Samples that take `ms` each to load (a sleep): a loader the step waits for."""

    def __init__(self, n=64, ms=2.0):
        self.n, self.ms = n, ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.ms / 1e3)
        return torch.zeros(1, 8, 8), i % 10


def tiny_step():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch):
        x, y = batch
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def check_chrome_trace(path, loader_name, active):
    with gzip.open(path, "rt") as f:
        raw = json.load(f)                                     # plain JSON, as Perfetto and chrome://tracing read it
    assert isinstance(raw["traceEvents"], list) and trace.invalid_events(raw) == []
    found = trace.names(raw)
    assert {f"ProfilerStep#{k}" for k in range(2, 2 + active)} <= found    # wait=1, warmup=1: steps 2.. recorded
    assert loader_name in found and "compute" in found
    assert any(n.startswith("autograd::engine::evaluate_function: ") for n in found)
    return trace.data_wait(raw)


def test_a_real_trace_recorded_in_process(tmp_path):
    loader = DataLoader(SlowDataset(ms=2.0), batch_size=8, num_workers=0)          # 16 ms of sleep per batch
    path = trace.record_loop(loader, tiny_step(), tmp_path / "w0.json.gz", wait=1, warmup=1, active=3, cuda=False)
    got = check_chrome_trace(path, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 3)
    assert got["steps"] == 3 and got["wait_ms"] >= 16.0                # the loader slept 8 x 2 ms in each step
    assert 0 < got["wait_share"] < 1 and got["compute_share"] > 0
    ax = plots_trace.plot_trace(path, title="W=0")
    assert [t.get_text() for t in ax.get_yticklabels()] == list(plots_trace.LOADING_LANES)
    assert len(ax.collections) == 3 and all(len(c.get_paths()) >= 1 for c in ax.collections)


def test_a_loader_too_short_for_the_schedule_is_named(tmp_path):
    loader = DataLoader(TensorDataset(torch.zeros(16, 1, 8, 8), torch.zeros(16, dtype=torch.long)), batch_size=8)
    with pytest.raises(ValueError, match="the loader gave 2 batches; the schedule needs 5"):
        trace.record_loop(loader, tiny_step(), tmp_path / "short.json", wait=1, warmup=1, active=3, cuda=False)


@pytest.mark.engines
def test_a_real_trace_with_loader_workers(tmp_path, no_leaks):
    loader = DataLoader(SlowDataset(ms=1.0), batch_size=8, num_workers=2)
    path = trace.record_loop(loader, tiny_step(), tmp_path / "w2.json.gz", wait=1, warmup=1, active=3, cuda=False)
    got = check_chrome_trace(path, "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 3)
    assert got["steps"] == 3
    axes = plots_trace.plot_traces({"W=2": path, "again": path})
    assert len(axes) == 2 and axes[0].get_title() == "W=2"


def test_the_committed_loading_traces_open_as_chrome_traces_with_the_lesson_s_spans():
    """results/loading_W*.json.gz (python -m kit.bench loading): valid Chrome trace JSON for Perfetto, with the steps,
    the DataLoader's __next__ and the compute that notebook 01's figure draws, and its W = 0 run waiting longer."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    paths = sorted((root / "results").glob("loading_W*.json.gz"))
    recorded = json.loads((root / "results" / "loading.json").read_text())["traces"]
    assert {p.name for p in paths} == set(recorded["files"]), (paths, recorded)
    waits = {}
    for p in paths:
        t = trace.load(p)
        assert not trace.invalid_events(t), p
        for pattern in (trace.STEP, trace.LOADER, trace.COMPUTE):
            assert trace.spans(t, pattern), f"{p.name}: no span matching {pattern}"
        waits[p.name] = trace.data_wait(t)
    w0 = waits.pop("loading_W0.json.gz")
    (best,) = waits.values()
    assert w0["wait_share"] > best["wait_share"], (w0, best)
