"""kit.ddp.profile: the naive and the overlapped DDP step recorded with torch.profiler on every engine (valid Chrome
trace JSON with Gloo's collective spans and backward's ops), and the share of communication hidden behind backward
computed on synthetic traces whose answer is known (AccumulateGrad, where the naive hook blocks, is not compute)."""
import json

import pytest

from kit import checks, trace
from kit.ddp import profile
from kit.ddp import schemes

ACC = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
MM = "autograd::engine::evaluate_function: AddmmBackward0"


def ev(name, ts, dur, tid=1):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "cat": "cpu_op"}


def steps(n, length):
    return [ev(f"ProfilerStep#{k + 2}", k * length, length) for k in range(n)]


def naive_trace():
    """Two 1000 µs steps: backward's op 0-400, then the hook (AccumulateGrad) blocks on a 500 µs allreduce."""
    out = steps(2, 1000)
    for t in (0, 1000):
        out += [ev(MM, t, 400), ev(ACC, t + 400, 520), ev("gloo:all_reduce", t + 410, 500, tid=2)]
    return {"traceEvents": out}


def overlap_trace():
    """Two 700 µs steps: backward's ops 0-400 (AccumulateGrad's hook 200-205 apart), an allreduce 100-600: 295 of
    its 500 µs beside backward's compute (0.59)."""
    out = steps(2, 700)
    for t in (0, 700):
        out += [ev(MM, t, 200), ev(ACC, t + 200, 5), ev(MM, t + 205, 195),
                ev("gloo:all_reduce", t + 100, 500, tid=2)]
    return {"traceEvents": out}


def test_the_hidden_share_is_read_from_the_traces_not_from_accumulate_grad():
    traces = {"naive": {0: naive_trace(), 1: naive_trace()}, "overlap": {0: overlap_trace(), 1: overlap_trace()}}
    sh = profile.shares(traces)
    assert sh["naive"][0]["hidden"] == 0.0                         # the hook's span is not backward's compute
    assert sh["overlap"][1]["hidden"] == pytest.approx(0.59)
    assert sh["overlap"][0]["comm_ms"] == pytest.approx(1.0)       # 2 steps × 500 µs
    assert profile.step_ms(traces["naive"]) == pytest.approx(1.0)
    # the traced steps save 300 of 500 µs of communication per step: 0.60, the spans say 0.59
    check = profile.hidden_check(traces)
    assert check.held and check.measured == pytest.approx(0.59) and check.bound == "0.40–0.80"   # 0.60 ± 0.20, 2×
    # the kit's own step times (kit.ddp.experiment's rows) saying nothing was saved: the check fails
    x = {"rows": [{"scheme": "naive", "step_ms": 1.0}, {"scheme": "overlap", "step_ms": 1.0}]}
    bad = profile.hidden_check(traces, x)
    assert not bad.held and bad.bound == "0.00–0.00" and checks.table([bad]).endswith("| **no** |")
    # within 20 points, yet far apart in ratio (as 4% against 20%): not agreement
    flat = {"naive": traces["naive"], "overlap": traces["naive"]}                  # nothing ran beside backward
    x10 = {"rows": [{"scheme": "naive", "step_ms": 1.0}, {"scheme": "overlap", "step_ms": 0.95}]}   # 10% saved
    ten = profile.hidden_check(flat, x10)
    assert ten.measured == 0.0 and ten.bound == "0.05–0.20" and not ten.held
    rows = profile.share_rows(traces)
    assert len(rows) == 4 and rows[-1] == {"scheme": "overlap", "rank": 1, "collectives ms": pytest.approx(1.0),
                                           "beside backward": pytest.approx(0.59)}


@pytest.mark.engines
@pytest.mark.timeout(300)
def test_engines_record_valid_traces_with_collectives_and_backward(tmp_path, cluster3):
    cfg = dict(schemes.CFG, sizes=(16, 24, 5), batch=8)
    traces = profile.record_all(cluster3, tmp_path, cfg, wait=0, warmup=1, active=2)
    assert set(traces) == set(profile.SCHEMES) and all(set(t) == {0, 1, 2} for t in traces.values())
    for scheme, by_rank in traces.items():
        for rank, tr in by_rank.items():
            path = tmp_path / f"{scheme}_rank{rank}.json"
            assert trace.invalid_events(json.loads(path.read_text())) == []          # opens in Perfetto
            assert len(trace.spans(tr, trace.STEP)) == 2
            assert trace.spans(tr, r"^gloo:all_reduce$") and trace.spans(tr, profile.BACKWARD_COMPUTE)
            assert trace.spans(tr, r"^c10d::allreduce_$")                            # launched on the main thread
    sh = profile.shares(traces)
    assert all(0.0 <= r["hidden"] <= 1.0 for s in sh.values() for r in s.values())
