"""kit.mp, in one process: the bubble and memory formulas, the AFAB and 1F1B orders (played by the simulator, they
give the formula's bubble and hold the activations the formula says), bad arguments, the stand-in compute."""
import time

import pytest
import torch

from kit.mp import model, pipeline as pp, tensor


def test_the_bubble_formula():
    assert model.bubble(1, 5) == 0
    assert model.bubble(2, 1) == pytest.approx(1 / 2)
    assert model.bubble(4, 8) == pytest.approx(3 / 11)
    assert model.step_time(4, 8, 1.0, 2.0) == pytest.approx(33.0)
    assert model.bubble(4, 1000) < 0.003                       # more micro-batches: the bubble shrinks


@pytest.mark.parametrize("name", ["afab", "1f1b"])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 16])
def test_each_schedule_played_gives_the_formula(name, p, m):
    acts = pp.schedule(name)
    for s in range(p):                                         # every micro-batch forward once, then backward once
        order = acts(p, m, s)
        assert sorted(order) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        assert all(order.index(("F", i)) < order.index(("B", i)) for i in range(m))
        assert pp.peak_held(order) == model.peak_in_flight(name, p, m, s)
    for tf, tb in ((1.0, 1.0), (1.0, 2.0), (0.5, 3.0)):
        events = pp.simulate(acts, p, m, tf, tb)
        assert len(events) == 2 * m * p
        assert pp.bubble_of(events) == pytest.approx(model.bubble(p, m))
        assert max(e["t1"] for e in events) == pytest.approx(model.step_time(p, m, tf, tb))


def test_1f1b_holds_at_most_p_and_afab_all_m():
    assert [model.peak_in_flight("1f1b", 4, 16, s) for s in range(4)] == [4, 3, 2, 1]
    assert [model.peak_in_flight("afab", 4, 16, s) for s in range(4)] == [16] * 4
    assert pp.one_f_one_b(2, 3, 0) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]
    assert pp.one_f_one_b(2, 3, 1) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]


def test_a_schedule_that_deadlocks_is_named():
    def backwards_first(p, m, stage):       # the last stage waits for a backward that needs its own forward first
        return [("B", i) for i in range(m)] + [("F", i) for i in range(m)] if stage == p - 1 else pp.afab(p, m, stage)
    with pytest.raises(ValueError, match="deadlocks"):
        pp.simulate(backwards_first, 2, 2)


@pytest.mark.parametrize("call, match", [
    (lambda: model.bubble(0, 4), "p"), (lambda: model.bubble(2, 0), "m"), (lambda: pp.afab(2, 2, 2), "stage"),
    (lambda: model.peak_in_flight("zb", 2, 2, 0), "schedule"), (lambda: pp.schedule("gpipe"), "schedule"),
    (lambda: model.memory_per_rank(10, 10, scheme="zero9"), "scheme"),
    (lambda: tensor.shard(torch.zeros(3, 4), 0, 0, 4, "out_features"), "out_features has 3"),
])
def test_bad_arguments_say_what_is_allowed(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_tensor_parallel_bytes_and_memory():
    assert model.tp_handed_bytes(batch=32, hidden=64) == 2 * 32 * 64 * 4
    assert model.ring_sent(1000, 2) == 1000 and model.ring_sent(1000, 4) == 1500 and model.ring_sent(10, 1) == 0
    dp, zero, tp = (model.memory_per_rank(1000, 4000, n=4, scheme=s) for s in ("dp", "zero3", "tp"))
    assert dp["total"] == 4 * 1000 * 4 + 4000
    assert zero["params"] == dp["params"] / 4 and zero["activations"] == dp["activations"]   # ZeRO keeps them
    assert tp["activations"] == 1000


def test_shards_cover_the_layer_on_uneven_sizes():
    w = torch.arange(7 * 5.0).reshape(7, 5)
    for n in (1, 2, 3, 5):
        rows = [tensor.shard(w, 0, r, n) for r in range(n)]
        assert torch.equal(torch.cat(rows, 0), w)
        assert max(r.shape[0] for r in rows) - min(r.shape[0] for r in rows) <= 1
        assert torch.equal(torch.cat([tensor.shard(w, 1, r, n) for r in range(n)], 1), w)


def test_the_stand_in_compute_takes_its_time_and_passes_gradients():
    x = torch.randn(3, 4, requires_grad=True)
    layer = pp.Delay(0.05, 0.1)
    t0 = time.perf_counter()
    y = layer(x)
    t1 = time.perf_counter()
    y.sum().backward()
    t2 = time.perf_counter()
    assert t1 - t0 >= 0.05 and t2 - t1 >= 0.1
    assert torch.equal(x.grad, torch.ones(3, 4)) and torch.equal(y, x)
