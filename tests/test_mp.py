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
    dp, zero, tp, pp_ = (model.memory_per_rank(1000, 4000, n=4, scheme=s, whole=400)
                         for s in ("dp", "zero3", "tp", "pp"))
    assert dp["total"] == 4 * 1000 * 4 + 1000 and zero["params"] == dp["params"] / 4


def test_every_row_of_the_memory_table_runs_one_global_batch():
    rows = {s: model.memory_per_rank(1000, 4000, n=4, scheme=s, whole=400) for s in ("dp", "zero3", "tp", "pp")}
    assert rows["dp"]["activations"] == rows["zero3"]["activations"] == rows["pp"]["activations"] == 1000
    assert rows["dp"]["params"] == 4000 and rows["zero3"]["params"] == rows["tp"]["params"] == 1000


def test_tensor_parallelism_keeps_each_blocks_input_and_output_whole():
    tp = model.memory_per_rank(1000, 4000, n=4, scheme="tp", whole=400)
    assert tp["activations"] == 400 + 3600 / 4          # Korthikanti et al. 2022: only the hidden ones split
    with pytest.raises(ValueError, match="whole"):
        model.memory_per_rank(1000, 4000, n=4, scheme="tp")


def test_the_activations_of_one_linear_are_its_input_not_its_weight():
    from kit.mp import memory
    lin = torch.nn.Linear(64, 32)
    x = torch.randn(16, 64)
    with memory.Saved(lin.parameters()) as s:
        lin(x)
    assert s.peak == x.numel() * 4 and s.copies == 0          # F.linear saves x and the weight: only x counts
    y = torch.randn(16, 32)
    m = memory.measure(lin, x, y, reps=1)                      # + the loss's saved output and target
    assert m["activations"] == (16 * 64 + 2 * 16 * 32) * 4


def test_the_stack_keeps_what_the_formula_says_and_checkpointing_peaks_in_backward():
    from kit.mp import lessons, memory
    x, y = memory.teacher_task(batch=64, d=64)
    plain = memory.measure(memory.stack(4, 64), x, y, reps=1)
    assert plain["activations"] == lessons.activation_bytes(4, 64, 64, 256)
    ckpt = memory.measure(memory.stack(4, 64), x, y, checkpoint=True, reps=1)
    assert ckpt["activations"] == 4 * 64 * (4 * 64 + 2 * 256)   # 4 block inputs once + one block's recompute
    bf16 = memory.measure(memory.stack(4, 64), x, y, bf16=True, reps=1)
    assert bf16["copies"] == 7 * 64 * 256 * 2    # bf16 weights: not the first's (its input needs no gradient)
    assert bf16["activations"] < plain["activations"]


def test_a_stage_keeps_the_formulas_micro_batches_of_activations_alive():
    m, mb, d = 4, 8, 32
    x, y = pp.data(m * mb, d)
    for name in ("afab", "1f1b"):
        r = pp.run_step(pp.make_model(1, d)[0], pp.schedule(name)(1, m, 0), stage=0, p=1, xs=x.chunk(m),
                        ys=y.chunk(m))
        assert r["mb_bytes"] == 5 * mb * d * 4          # input, GELU's input and output; the loss's output, target
        assert r["peak_bytes"] == model.peak_in_flight(name, 1, m, 0) * r["mb_bytes"]


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


def test_the_schedule_grader_says_unanswered_or_what_is_wrong_without_the_answer():
    from kit.mp import exercises
    assert exercises.check_schedule(lambda p, m, s: None, "afab", None) == "AFAB: not answered yet"
    wrong = exercises.check_schedule(pp.afab, "1f1b", None)              # AFAB's order graded as 1F1B
    assert wrong.startswith("1F1B: wrong (p=2, m=3: the stages hold [3, 3]")
    assert "wrong" in exercises.check_schedule(lambda p, m, s: pp.afab(p, m, s)[::-1], "afab", None)
    missing = exercises.check_schedule(lambda p, m, s: pp.afab(p, m, s)[1:], "afab", None)
    assert "one F and one B" in missing
