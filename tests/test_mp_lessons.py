"""kit.mp.lessons and kit.mp.lab.claims: notebook 06's lessons as checks of numbers, on runs made up here (one that
meets each bound, one that breaks it): every check can fail."""
import json
from pathlib import Path

from kit.bench import mp as bench_mp
from kit.mp import lab as mplab, lessons, model, pipeline as pp
from kit.netlab.counters import HEADER_BYTES, MSS, payload

REPO = Path(__file__).resolve().parents[1]


def sweep_of(ps=(2, 4), ms=(1, 4, 16), overhead=0.0, leak=1.0):
    """A sweep as kit.mp.experiment.sweep returns it, played by the simulator (+ `overhead` of idle per action);
    each stage holds the formula's micro-batches of 100 bytes each, times `leak` on AFAB's stage 0."""
    rows = []
    for p in ps:
        for m in ms:
            for name in ("afab", "1f1b"):
                ev = pp.simulate(pp.schedule(name), p, m, tf=1.0, tb=2.0, link=overhead)
                b = pp.bubble_of(ev)
                formula = [model.peak_in_flight(name, p, m, s) for s in range(p)]
                held = [100 * k * (leak if name == "1f1b" and s == 0 else 1) for s, k in enumerate(formula)]
                rows.append({"p": p, "m": m, "schedule": name, "bubble": b, "bubble_range": [b, b],
                             "model": model.bubble(p, m), "peak": formula, "peak_bytes": held,
                             "mb_bytes": [100] * p, "peak_model": formula})
    return {"rows": rows}


def test_the_bubble_check_fails_when_hops_cost_time_or_no_row_has_m_at_least_p():
    good = lessons.bubble_check(sweep_of())
    assert good.held and good.measured < 1e-9
    bad = lessons.bubble_check(sweep_of(overhead=0.5))        # each hop half a forward: the formula is off
    assert not bad.held and bad.measured > 0.15
    assert not lessons.bubble_check(sweep_of(ms=(1,), ps=(2,))).held


def test_the_memory_check_fails_when_a_stage_keeps_more_bytes_than_the_formula():
    good = lessons.memory_checks(sweep_of(), 4, 16)
    assert all(c.held for c in good) and [c.measured for c in good[:2]] == [16, 4]
    bad = lessons.memory_checks(sweep_of(leak=1.5), 4, 16)    # 1F1B's stage 0 keeps half as much again
    assert [c.held for c in bad] == [True, False, False] and bad[1].measured == 6 and bad[2].measured == 1.5


def tp_run(ok=True, allreduces=2, handed=16384, kit_ms=6.0):
    diff = {"out": 1e-7, "dx": 2e-7, "grads": 3e-7 if ok else 0.5, "ok": ok}
    return {"cfg": {"d": 64, "hidden": 256, "batch": 32}, "diff": [diff] * 4, "ok": ok, "allreduces": allreduces,
            "handed": handed, "model_handed": 16384, "ms": {"full": 0.6, "kit": kit_ms, "torch": 12.0}}


def test_the_tensor_parallel_checks_fail_on_a_wrong_layer_an_extra_allreduce_and_a_fast_split():
    assert [c.held for c in lessons.tp_checks(tp_run(), tp_run())] == [True] * 4
    assert [c.held for c in lessons.tp_checks(tp_run(ok=False), tp_run())] == [False, True, True, True]
    assert [c.held for c in lessons.tp_checks(tp_run(allreduces=3, handed=24576), tp_run())] == [True, False, False,
                                                                                                  True]
    assert [c.held for c in lessons.tp_checks(tp_run(kit_ms=0.5), tp_run())] == [True, True, True, False]


def test_gradient_checks_fail_beyond_their_tolerance():
    assert lessons.grads_check({"errs": {"afab": [1e-8]}, "tol": 1e-5, "ok": True}).held
    assert not lessons.grads_check({"errs": {"afab": [0.1]}, "tol": 1e-5, "ok": False}).held
    assert not lessons.torch_check({"rows": {"afab": {"err": 0.1}, "1f1b": {"err": 0.0}}}).held
    bad = lessons.hybrid_checks({"1f1b": {"errs": [0.0, 0.2], "tol": 1e-5, "ok": False}})
    assert not bad[0].held and bad[0].measured == 0.2


def test_the_activation_formula_and_its_check():
    mib = 2 ** 20                            # 8 blocks x (0.25 + 1 + 1 MiB) + 0.5 MiB, batch 256, d 256
    assert lessons.activation_bytes(8, 256, 256, 1024) == 18.5 * mib
    assert lessons.measured_check("a", 18.5 * mib, 18.5 * mib).held
    assert not lessons.measured_check("a", 33.5 * mib, 18.5 * mib).held      # the weights counted too


def test_the_lever_and_learning_checks_can_fail():
    mib = 2 ** 20
    plain, bf16 = {"activations": 18.5 * mib, "ms": 40.0}, {"activations": 9.5 * mib, "ms": 60.0}
    good = lessons.lever_checks(plain, {"activations": 4 * mib, "ms": 55.0}, bf16, 8, 256, 256)
    assert all(c.held for c in good)
    forward_only = {"activations": 2.5 * mib, "ms": 30.0}      # what forward kept, not the recompute's peak; faster
    bad = lessons.lever_checks(plain, forward_only, plain, 8, 256, 256)
    assert not any(c.held for c in bad)
    assert all(c.held for c in lessons.learning_checks([1.0, 0.01], [1.0, 0.012]))
    flat = lessons.learning_checks([1.0, 0.99], [1.0, 0.99])   # random targets: nothing is learned
    assert [c.held for c in flat] == [False, True]
    assert [c.held for c in lessons.learning_checks([1.0, 0.01], [1.0, 0.5])] == [True, False]


def test_the_placement_checks_can_fail():
    x = json.loads((REPO / "results" / "mp.json").read_text())["placement"]
    x = {**x, "delta_ms": x["model_delta_ms"]}                                                 # as the model says
    assert all(c.held for c in mplab.claims(x))
    short = {**x, "rows": [{**r, "nic_payload": r["model_tx"] * 0.9} for r in x["rows"]]}     # 10% short
    assert [c.held for c in mplab.claims(short)][:2] == [False, False]
    over = [{**r, "nic_payload": r["model_tx"] * 1.05} for r in x["rows"]]                     # 5% over it
    assert [c.held for c in mplab.claims({**x, "rows": over})][:2] == [False, False]
    resent = [{**r, "nic_retrans": 0.05 * r["model_tx"] / MSS} for r in over]                  # segments sent again
    assert [c.held for c in mplab.claims({**x, "rows": resent})][:2] == [True, True]
    a, b = x["rows"]
    swapped = {**x, "rows": [{**a, "step_ms": b["step_ms"], "loss": 1.0}, {**b, "step_ms": a["step_ms"], "loss": 2.0}],
               "delta_ms": -x["delta_ms"]}
    assert [c.held for c in mplab.claims(swapped)][2:] == [False, False, False]


def test_the_nic_payload_is_its_bytes_less_each_packets_headers():
    assert HEADER_BYTES == 66                                  # Ethernet 14 + IPv4 20 + TCP 20 + timestamps 12
    assert payload(1_000_000, 100) == 1_000_000 - 6_600
    assert payload(66 * 50, 50) == 0                           # pure ACKs carry no payload


def test_the_benchmark_summary_carries_every_check_of_its_run():
    x = json.loads((REPO / "results" / "mp.json").read_text())
    every = lessons.bench_checks(x)
    line = bench_mp.summary(x)
    assert all(c.name in line for c in every)
    assert all(f"{c.name} did not hold" in line for c in every if not c.held)


def test_the_table_of_numbers():
    assert lessons.table([{"a": 1, "b": 0.5}, {"a": 1200, "b": "—"}]).splitlines() == [
        "| a | b |", "|---|---|", "| 1 | 0.500 |", "| 1,200 | — |"]
