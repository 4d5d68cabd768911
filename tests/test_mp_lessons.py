"""kit.mp.lessons and kit.mp.lab.claims: notebook 06's lessons as kit.checks values, on runs made up here (one
that meets each bound, one that breaks it): each check can fail, and then says why."""
import json
from pathlib import Path


from kit import checks
from kit.bench import mp as bench_mp
from kit.mp import lab as mplab, lessons, model, pipeline as pp
from kit.netlab.counters import HEADER_BYTES, MSS, payload

REPO = Path(__file__).resolve().parents[1]


def sweep_of(ps=(2, 4), ms=(1, 4, 16), overhead=0.0, afab_peak=None):
    """A sweep as kit.mp.experiment.sweep returns it, played by the simulator (+ `overhead` of idle per action)."""
    rows = []
    for p in ps:
        for m in ms:
            for name in ("afab", "1f1b"):
                ev = pp.simulate(pp.schedule(name), p, m, tf=1.0, tb=2.0, link=overhead)
                b = pp.bubble_of(ev)
                peak = [pp.peak_held(pp.schedule(name)(p, m, s)) for s in range(p)]
                if name == "afab" and afab_peak is not None:
                    peak = [afab_peak] * p
                rows.append({"p": p, "m": m, "schedule": name, "bubble": b, "bubble_range": [b, b],
                             "model": model.bubble(p, m), "peak": peak, "peak_bytes": [100 * k for k in peak],
                             "peak_model": [model.peak_in_flight(name, p, m, s) for s in range(p)]})
    return {"rows": rows}


def test_the_bubble_holds_on_the_formula_and_fails_with_its_reason_when_hops_cost_time():
    good = lessons.bubble_check(sweep_of())
    assert good.held and "0% from the formula" in good.measured
    bad = lessons.bubble_check(sweep_of(overhead=0.5))        # each hop half a forward: the formula is off
    assert not bad.held and "wait in recv" in bad.reason
    assert "did not hold" in checks.markdown([bad])
    none = lessons.bubble_check(sweep_of(ms=(1,), ps=(2,)))
    assert not none.held and "m ≥ p" in none.reason


def test_activations_held_fail_when_a_schedule_holds_other_than_the_formula():
    assert all(c.held for c in lessons.memory_checks(sweep_of(), 4, 16))
    bad = lessons.memory_checks(sweep_of(afab_peak=2), 4, 16)  # AFAB holding 2, not m
    names = {c.name: c for c in bad}
    assert not names["AFAB holds all m"].held and not names["as the formula says"].held
    assert names["1F1B holds at most p"].held
    assert "p = 2, m = 4 held [2, 2]" in names["AFAB holds all m"].reason


def tp_run(ok=True, allreduces=2, handed=16384):
    diff = {"out": 1e-7, "dx": 2e-7, "grads": 3e-7 if ok else 0.5, "ok": ok}
    return {"cfg": {"d": 64, "hidden": 256, "batch": 32}, "diff": [diff] * 4, "ok": ok, "allreduces": allreduces,
            "handed": handed, "model_handed": 16384, "sent": 24576.0, "held": [33280] * 4, "full": 132352}


def test_tensor_parallel_checks_fail_on_a_wrong_layer_and_an_extra_allreduce():
    assert [c.held for c in lessons.tp_checks(tp_run(), tp_run())] == [True, True]
    equal, bytes_ = lessons.tp_checks(tp_run(ok=False), tp_run())
    assert not equal.held and "0.5" in equal.reason and bytes_.held
    _, bytes_ = lessons.tp_checks(tp_run(allreduces=3, handed=24576), tp_run())
    assert not bytes_.held and "3 times" in bytes_.reason and "+8,192" in bytes_.reason


def test_the_memory_table_and_note_say_what_fits_the_budget():
    mib = 2**20
    one = {"params": 16 * mib, "grads": 16 * mib, "optimizer": 32 * mib, "activations": 32 * mib}
    zero = model.memory_per_rank(4 * mib, 32 * mib, n=4, scheme="zero3")      # 4 Mi float32 parameters
    rows = {"one process": one, "ZeRO-3 / FSDP, per rank of 4": zero}
    table = lessons.memory_table(rows, budget=48 * mib).splitlines()
    assert table[2] == "| one process | 16.0 MiB | 16.0 MiB | 32.0 MiB | 32.0 MiB | 96.0 MiB | **no** |"
    assert table[3] == "| ZeRO-3 / FSDP, per rank of 4 | 4.0 MiB | 4.0 MiB | 8.0 MiB | 32.0 MiB | 48.0 MiB | yes |"
    note = lessons.memory_note(one, zero, 47 * mib, batch=256, n=4)
    assert "Adam state 64.0 MiB, activations 32.0 MiB for a batch of 256" in note and "(47.0 MiB)" in note
    assert "over 4 ranks brings the state down to 16.0 MiB but keeps all 32.0 MiB" in note
    assert "48.0 MiB in all: it does **not** fit" in note
    assert "it fits here, but only just" in lessons.memory_note(one, zero, 48 * mib, batch=256, n=4)


def test_the_tp_table_and_the_unsharded_check_say_what_ran_faster():
    mine = {**tp_run(), "ms": {"full": 0.58, "kit": 6.49, "torch": 12.36}, "torch_error": None, "torch_diff": 3.9e-7}
    table = lessons.tp_table(mine).splitlines()
    assert table[2:] == ["| unsharded, one process per rank | — | 0.58 ms |",
                         "| your Column + Row | 3.0e-07 | 6.49 ms |",
                         "| `parallelize_module(ColwiseParallel, RowwiseParallel)` | 3.9e-07 | 12.36 ms |"]
    refused = {**mine, "torch_error": "sizes differ", "torch_diff": None, "ms": {**mine["ms"], "torch": None}}
    assert lessons.tp_table(refused).endswith("| refused: sizes differ | — |")
    odd = {**refused, "cfg": {"d": 30, "hidden": 77, "batch": 9}}
    assert lessons.torch_odd_note(odd, 4).startswith("On odd sizes (hidden 77 over 4 ranks) PyTorch refused: "
                                                     "`sizes differ` — its row-wise layer")
    assert lessons.torch_odd_note(mine, 4).endswith("PyTorch also matched (3.9e-07).")
    ok = lessons.unsharded_check(mine["ms"])
    assert ok.held and "unsharded 0.58 ms, your Column + Row 6.49 ms" in checks.markdown([ok])
    assert "The allreduces cost more than the split matmuls save" in ok.detail
    bad = lessons.unsharded_check({"full": 7.0, "kit": 6.49})
    text = checks.markdown([bad])
    assert not bad.held and "did not hold" in text and f"because {bad.reason}" in text
    assert "unsharded 7.00 ms, your Column + Row 6.49 ms" in text and "cost more" not in bad.detail


def test_the_levers_and_the_placement_checks_can_fail():
    plain = {"activations": 1000, "ms": 10.0}
    good = lessons.lever_checks(plain, {"activations": 200, "ms": 12.0}, {"activations": 500, "ms": 11.0}, 1.0, 1.0)
    assert all(c.held for c in good)
    bad = lessons.lever_checks(plain, {"activations": 1000, "ms": 12.0}, {"activations": 1000, "ms": 11.0}, 1.0, 1.0)
    assert not any(c.held for c in bad) and "did not save" in bad[0].reason
    x = json.loads((REPO / "results" / "mp.json").read_text())["placement"]
    x["rows"] = [{**r, "nic_payload": r["model_tx"] * 0.9} for r in x["rows"]]     # 10% short of the model
    assert [c.held for c in mplab.claims(x)][:2] == [False, False]
    assert "less than the model" in mplab.claims(x)[0].reason
    x["rows"] = [{**r, "nic_payload": r["model_tx"] * 1.05} for r in x["rows"]]    # 5% over it
    assert [c.held for c in mplab.claims(x)][:2] == [False, False]
    assert "beside the job" in mplab.claims(x)[1].reason
    resent = [{**r, "nic_retrans": 0.05 * r["model_tx"] / MSS} for r in x["rows"]]   # the 5% were segments resent
    assert [c.held for c in mplab.claims({**x, "rows": resent})][:2] == [True, True]


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


def test_the_torch_and_lever_tables_carry_the_runs_numbers():
    mine = {"afab": {"step_s": 0.0123}, "1f1b": {"step_s": 0.0117}}
    t = {"rows": {"afab": {"step_s": 0.0141, "err": 3.2e-7}, "1f1b": {"step_s": 0.0139, "err": 4.1e-7}},
         "model_step_s": 0.0105}
    text = lessons.torch_table(mine, t)
    assert "| AFAB (GPipe) | 12 ms | 14 ms | 3.2e-07 |" in text and "| 1F1B | 12 ms | 14 ms | 4.1e-07 |" in text
    assert "(m+p−1)(t_f+t_b): 10 ms" in text
    plain, ckpt, bf16 = ({"activations": a * 2**20, "ms": ms} for a, ms in ((8.0, 40), (1.5, 55), (4.1, 61)))
    table = lessons.lever_table(plain, ckpt, bf16, 0.123456, 0.123789)
    assert "| float32 | 8.0 MiB | 40 ms | 0.12346 |" in table
    assert "| checkpointing every block | 1.5 MiB | 55 ms |" in table
    assert "| bf16 autocast | 4.1 MiB | 61 ms | 0.12379 |" in table
