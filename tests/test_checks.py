"""kit.checks (a lesson checked on a run, as a value, and its one renderer) and every check of notebook 05
(kit.ddp.lessons, kit.ddp.memory, kit.ddp.lab): each is forced to fail on a recorded run and its rendering read:
"did not hold … because …". Pure Python on the committed results/ddp.json and results/ddp_lab.json."""
import copy
import json
from pathlib import Path

import pytest

from kit import checks
from kit.checks import Check
from kit.ddp import lab, lessons, memory
from kit.netlab.counters import MSS

RESULTS = Path(__file__).parent.parent / "results"


def _ddp_run() -> dict:
    """The committed `python -m kit.bench ddp` run, with a peak on the ZeRO-1 and FSDP2 rows at their formulas
    (ZeRO-1's with its ring's two receive buffers)."""
    x = copy.deepcopy(json.loads((RESULTS / "ddp.json").read_text()))
    N, K = x["N"], x["K"]
    for r in x["rows"]:
        kind = r["scheme"].partition(":")[0]
        if kind in ("zero", "fsdp"):
            shard = K // N
            parts = {"params": K if kind == "zero" else shard, "grads": K if kind == "zero" else shard,
                     "optimizer": shard, "temporary": memory.scratch_bytes(x) if kind == "zero" else 0}
            r["peak"] = {**parts, "total": sum(parts.values())}
    return x


def _lab_run(N: int = 3) -> dict:
    """A recorded run of `python -m kit.bench ddp_lab` (the committed results), to force each check both ways."""
    doc = json.loads((RESULTS / "ddp_lab.json").read_text())
    return copy.deepcopy(next(x for x in doc["runs"] if x["N"] == N))


def _one(found: list[Check], name: str) -> Check:
    return next(c for c in found if c.name == name)


def _failed(c: Check) -> str:
    """Render a check that must have failed; return its Markdown after reading the verdict in both renderings."""
    text = checks.markdown([c])
    assert not c.held and "**did not hold** on this run" in text and f"because {c.reason}" in text, text
    assert f"{c.name} did not hold because {c.reason}" in checks.summary_line([c])
    return text


# ----------------------------------------------------------------------------------- the renderer
def test_a_check_renders_held_or_did_not_hold_because():
    ok = Check("fp16", measured="0.502× DDP's bytes", bound="0.500 ± 0.015", held=True, detail="1,000 bytes")
    bad = Check("bytes", measured="1.10× the ring model", bound="1 ± 0.03", held=False, reason="headers doubled")
    text = checks.markdown([ok, bad])
    assert text.splitlines() == [
        "- **fp16** held: 0.502× DDP's bytes (bound: 0.500 ± 0.015). 1,000 bytes.",
        "- **bytes** **did not hold** on this run: 1.10× the ring model (bound: 1 ± 0.03), because headers doubled."]
    assert checks.summary_line([ok, bad]) == "held: fp16; bytes did not hold because headers doubled"
    assert checks.markdown([ok], details=False) == "- **fp16** held: 0.502× DDP's bytes (bound: 0.500 ± 0.015)."
    assert checks.from_dict(bad.as_dict()) == bad


def test_the_table_has_one_row_per_check_and_says_no_where_one_did_not_hold():
    ok = Check("fp16 halves the bytes", measured=0.50234, bound="0.500 ± 0.015", held=True, unit="×")
    bad = Check("peak", measured=12345.6, bound=1.0e7, held=False, unit=" B")
    assert checks.table([ok, bad]).splitlines() == [
        "| check | measured | predicted or bound | held |", "|---|---|---|---|",
        "| fp16 halves the bytes | 0.502× | 0.500 ± 0.015 | yes |",
        "| peak | 12,346 B | 1e+07 B | **no** |"]
    assert checks.summary_line([ok, bad]) == "held: fp16 halves the bytes; peak did not hold"


def test_a_check_is_refused_without_a_name_or_with_a_held_that_is_not_a_bool():
    with pytest.raises(ValueError, match="a check needs a name"):
        Check("", measured=1, bound=2, held=True)
    with pytest.raises(TypeError, match="held must be a bool, got str"):
        Check("x", measured=1, bound=2, held="yes")
    with pytest.raises(ValueError, match="needs at least one Check"):
        checks.table([])


# ----------------------------------------------------------------------------------- section 2 (kit.ddp.lessons)
def test_the_in_flight_note_counts_each_ranks_allreduces_and_says_what_unfinished_ones_mean():
    in_flight = [[(0, 14), (3, 14)], [(14, 14), (0, 14)]]            # per rank, per step: (completed, launched)
    text = lessons.in_flight_note(in_flight, 25)
    assert "per step (rank 0: 0 of 14, 3 of 14; rank 1: 14 of 14, 0 of 14)" in text
    assert "In all, 25 allreduces were still running" in text and "unfinished sums" in text
    done = lessons.in_flight_note([[(14, 14)], [(14, 14)]], 0)
    assert "(rank 0: 14 of 14; rank 1: 14 of 14)" in done and "nothing guarantees it" in done


def test_the_finish_check_holds_within_its_tolerance_and_names_each_ranks_difference_when_not():
    ok = lessons.finish_check([1e-7, 3e-7, 2e-7])
    assert ok.held and "within 3.0e-07 of one process" in checks.markdown([ok])
    text = _failed(lessons.finish_check([1e-7, 2e-3, 2e-7]))
    assert "within 2.0e-03 of one process" in text and "(bound: 1e-05)" in text
    assert "per rank were 1.0e-07, 2.0e-03, 2.0e-07" in text


def test_the_zero_step_check_wants_one_process_weights_and_a_shard_of_momentum_per_rank():
    ok = lessons.zero_step_check([2e-7, 1e-7, 3e-7], [4, 4, 4], numel=10)
    assert ok.held and "momentum per rank: 4, 4, 4 of 10 elements" in checks.markdown([ok])
    text = _failed(lessons.zero_step_check([2e-7, 4e-2, 3e-7], [10, 4, 4], numel=10))
    assert "rank 1's weights differ by 4.0e-02" in text and "rank 0 kept momentum for 10 elements, not 4" in text
    assert "rank 2" not in text.split("because")[1]


# ----------------------------------------------------------------------------------- sections 4-7 (kit.ddp.lessons)
def test_every_lesson_holds_or_fails_on_the_recorded_run_as_its_numbers_say():
    x = _ddp_run()
    found = lessons.all_checks(x, cores=2)
    assert [c.name for c in found] == ["correct", "buckets", "α–β model", "overlap on loopback", "fp16 bytes",
                                       "ZeRO-1 memory", "FSDP2 memory"]
    assert _one(found, "correct").held and _one(found, "fp16 bytes").held and _one(found, "FSDP2 memory").held


def test_the_correct_check_fails_when_a_scheme_ends_with_other_weights():
    x = _ddp_run()
    row = next(r for r in x["rows"] if r["scheme"] == "overlap")
    row["ok"], row["err"] = False, 0.5
    assert "overlap: async, wait before step did not end with one process's weights" in _failed(
        lessons.correct_check(x))


def test_the_bucket_check_fails_when_fewer_messages_are_slower():
    x = _ddp_run()
    many, few = lessons.bucket_extremes(x)
    few["step_ms"] = many["step_ms"] + 5
    assert f"{few['label']} took {few['step_ms']:.1f} ms" in _failed(lessons.buckets_check(x))


def test_the_bucket_check_wants_the_difference_outside_the_steps_spread():
    x = _ddp_run()
    many, few = lessons.bucket_extremes(x)
    many.update(step_ms=30.0, steps_ms=[24.0, 29.0, 30.0, 31.0, 38.0])
    few.update(step_ms=28.0, steps_ms=[22.0, 27.0, 28.0, 32.0, 37.0])           # a lower median, the same spread
    assert lessons.win_rate(few["steps_ms"], many["steps_ms"]) == 0.6
    said = _failed(lessons.buckets_check(x))
    assert "the shorter in only 60% of the pairs of timed steps: the 2.0 ms between the medians" in said
    few.update(steps_ms=[22.0, 23.0, 28.0, 28.5, 29.0])
    for r in x["rows"]:                   # the other 5-allreduce size at the same median: no same-count noise
        if r["scheme"].startswith("buckets:") and r["calls"] == many["calls"]:
            r["step_ms"] = many["step_ms"]
    ok = lessons.buckets_check(x)
    assert ok.held and "the shorter in 86% of the pairs" in checks.markdown([ok])


def test_the_bucket_and_model_checks_want_the_saving_above_the_same_count_noise():
    x = _ddp_run()
    rows = sorted((r for r in x["rows"] if r["scheme"].startswith("buckets:")), key=lambda r: -r["calls"])
    rows[1]["calls"] = rows[0]["calls"]                        # two sizes with the most allreduces, one count
    many, few = lessons.bucket_extremes(x)
    twins = [r for r in x["rows"] if r["scheme"].startswith("buckets:") and r["calls"] == many["calls"]]
    assert len(twins) == 2
    model = many["model_comm_ms"] - few["model_comm_ms"]
    twins[0].update(step_ms=30.0, steps_ms=[29.0, 30.0, 31.0])
    twins[1].update(step_ms=30.0 + 0.6 * model, steps_ms=[30.0, 30.0 + 0.6 * model, 31.0 + 0.6 * model])
    few.update(step_ms=30.0 - model, steps_ms=[29.0 - model, 30.0 - model, 30.5 - model])    # the model's saving
    many = lessons.bucket_extremes(x)[0]
    assert many is twins[0] and lessons.noise_ms(x) == pytest.approx(0.6 * model)
    said = _failed(lessons.buckets_check(x))                 # saved 1.0 model, noise 0.6: under twice the noise
    assert f"the {model:.1f} ms saved is under twice the {0.6 * model:.1f} ms between settings with the same " \
           "count (this run's noise): this run alone does not separate the counts" in said
    assert "so it cannot test the model" in _failed(lessons.model_check(x, cores=2))
    twins[1].update(step_ms=30.0 + 0.4 * model)              # noise 0.4 of the saving: both hold
    assert lessons.buckets_check(x).held and lessons.model_check(x, cores=2).held


def test_the_model_check_fails_when_the_saving_is_far_from_the_models():
    x = _ddp_run()
    many, few = lessons.bucket_extremes(x)
    model = many["model_comm_ms"] - few["model_comm_ms"]
    few["step_ms"] = many["step_ms"] - 0.1 * model                                   # 0.1× the model's saving
    assert f"the step saved less than the model's {model:.1f} ms" in _failed(lessons.model_check(x, cores=7))
    few["step_ms"] = many["step_ms"] - 10 * model                                    # 10×: each call waited for a core
    fewer = many["calls"] - few["calls"]
    said = _failed(lessons.model_check(x, cores=7))
    assert f"each allreduce fewer saved {10 * model / fewer:.1f} ms" in said and "share 7 cores" in said
    few["step_ms"] = many["step_ms"] - 1.5 * model
    assert lessons.model_check(x, cores=7).held


def test_the_model_check_says_where_its_alpha_came_from():
    x = {**_ddp_run(), "alpha_s": 250e-6, "alpha_pingpong_s": 47e-6, "N": 3,
         "allreduce_1float": {"seconds": 1e-3, "range": [0.6e-3, 3e-3], "repeats": 20}}
    detail = lessons.model_check(x, cores=2).detail
    assert "α = 250 µs as an allreduce pays it here (one float among the 3 engines took 1000 µs, median of 20 " \
           "calls, 600–3000, over its 2(N−1) = 4 messages in sequence; the ping-pong between two engines gave 47 µs)" \
           in detail


def test_the_overlap_and_fp16_checks_fail_when_their_numbers_say_so():
    x = _ddp_run()
    rows = {r["scheme"]: r for r in x["rows"]}
    rows["overlap"]["step_ms"] = rows["naive"]["step_ms"] + 1
    assert "no core is free for Gloo's thread" in _failed(lessons.overlap_check(x, cores=2))
    fp16 = next(r for r in x["rows"] if r["scheme"].startswith("ddp_fp16:"))
    fp16["handed"] *= 2
    _failed(lessons.fp16_check(x))


def test_the_memory_check_fails_when_a_sharded_schemes_peak_exceeds_one_nth():
    x = _ddp_run()
    fsdp = next(r for r in x["rows"] if r["scheme"] == "fsdp")
    fsdp["peak"]["grads"] = x["K"]                        # the full gradient alive at once: not ZeRO-3
    fsdp["peak"]["total"] = sum(v for k, v in fsdp["peak"].items() if k != "total")
    text = _failed(_one(memory.memory_checks(x), "FSDP2 memory"))
    assert "the gradients were 1.00× K" in text and "where the formula has K/N" in text


def test_zero1s_memory_check_fails_when_its_step_holds_a_full_flat_copy():
    x = _ddp_run()
    zero = next(r for r in x["rows"] if r["scheme"] == "zero")
    assert _one(memory.memory_checks(x), "ZeRO-1 memory").held            # its state and the ring's scratch: held
    scratch = memory.scratch_bytes(x)
    assert scratch == 2 * 4 * -(-x["K"] // 4 // x["N"])                  # 4 MiB pieces: larger than a chunk here
    zero["peak"]["temporary"] += x["K"]                    # a step that copies the whole gradient beside .grad
    zero["peak"]["total"] += x["K"]
    text = _failed(_one(memory.memory_checks(x), "ZeRO-1 memory"))
    assert f"the temporaries {(scratch + x['K']) / x['K']:.2f}× K" in text, text
    assert f"the ring's two receive buffers ({scratch / x['K']:.2f}× K)" in text, text


def test_the_memory_table_puts_each_zero_stage_beside_its_formula():
    x = _ddp_run()
    table, note = memory.memory_table(x).split("\n\n")
    rows = table.splitlines()[2:]
    assert note.startswith("≥: a lower bound. Horovod's fusion buffer")          # C++ buffers the meter cannot see
    assert all(("| ≥ " in row) == any(k in row for k in ("Horovod", "fp16")) for row in rows), rows
    assert "not implemented here" in rows[2]                             # stage 2: formula only
    ring = memory.scratch_bytes(x) / (3 * x["K"])                        # ZeRO-1: the ring's scratch beside the state
    assert f"| 1 | optimizer state | {memory.formula(1, x['N']):.3f} + {ring:.3f} (the ring's two receive buffers) |" \
        in rows[1], rows[1]
    layer = 2 * memory.unit_bytes(x) / (3 * x["K"])                      # FSDP2: one layer unsharded beside the shards
    assert f"| 3 | + parameters (FSDP) | {1 / x['N']:.3f} + {layer:.3f} (one layer unsharded) |" in rows[3]
    ddp = next(r["scheme"] for r in x["rows"] if r["scheme"].startswith("ddp:"))   # stage 0's row
    others = [r for r in x["rows"] if "peak" in r and r["scheme"] not in ("local", "zero", "fsdp", ddp)]
    assert len(rows) == 4 + len(others) and all(f"| 0 | nothing | 1.000 | {r['label']} |" in row
                                                for r, row in zip(others, rows[4:]))
    assert memory.formula(1, 4) == pytest.approx((2 + 0.25) / 3) and memory.formula(3, 4) == 0.25


# ----------------------------------------------------------------------------------- section 8 (kit.ddp.lab)
def test_the_overlap_check_reads_the_interleaved_rounds_and_says_why_it_failed():
    x = _lab_run()
    p = x["paired"]
    for k, ms in {"local": 20.0, "forward": 4.0, "step": 2.0, "comm": 60.0, "naive": 80.0, "overlap": 68.0}.items():
        p[k]["ms"] = ms
    c = lab.overlap_check(x)
    text = checks.markdown([c])
    assert c.held and "68.0 ms = 1.13× max(compute, comm)" in text and "hid 12.0 of the 14.0 ms" in text
    assert "forward + max(backward, comm) + step = 66.0 ms; the overlapped step took 1.03× that" in text
    p["overlap"]["ms"] = 79.0                               # nothing hidden: compute + comm
    p["local_sleep"]["ms"], p["overlap_sleep"]["ms"] = 22.0, 67.0          # with free cores: 15 of 16 ms hidden
    text = _failed(lab.overlap_check(x))
    assert "1.32× max" in text
    assert "the overlap hid 15.0 of the 16.0 ms it could hide: here the cores, not the method" in text
    p["overlap_sleep"]["ms"] = 77.0                         # free cores hid 5 of 16 ms: not the reason
    text = _failed(lab.overlap_check(x))
    assert "the overlap hid 5.0 of the 16.0 ms it could hide: even with free cores it hid less than half" in text
    assert "the cores, not the method" not in text
    p["overlap_sleep"]["ms"] = 87.0                         # not even with free cores: no reason claimed
    text = _failed(lab.overlap_check(x))
    assert "nothing was hidden (the overlapped step took 5.0 ms more" in text
    assert "the cores, not the method" not in text


def test_the_wire_checks_hold_on_the_recorded_run_and_fail_when_the_bytes_are_off():
    x = _lab_run()
    assert [c.name for c in lab.claims(x)][:4] == ["overlap", "fp16", "bytes", "fsdp bytes"]
    assert all(c.held for c in lab.claims(x) if c.name in ("fp16", "bytes", "fsdp bytes", "FSDP2 memory"))
    rows = {r["scheme"]: r for r in x["rows"]}
    fp16 = next(r for s, r in rows.items() if s.startswith("ddp_fp16:"))
    fp16["nic_tx"] = [b * 1.1 for b in fp16["nic_tx"]]       # 0.55× DDP's bytes: not half
    assert "not half" in _failed(lab.fp16_check(x))
    x = _lab_run()
    rows = {r["scheme"]: r for r in x["rows"]}
    rows["zero"]["nic_payload"] = [b * 1.05 for b in rows["zero"]["nic_payload"]]   # 5% more than the ring's
    text = _failed(lab.bytes_check(x))
    assert "ZeRO" in text and "1.05" in text
    rows["zero"]["nic_retrans"] = [0.05 * rows["zero"]["sent"] / MSS] * 3              # ... all of it resent
    assert lab.bytes_check(x).held
    f = rows["fsdp"]                                        # Gloo: every reduce-scatter costs an allreduce
    gloo = lab.gloo_bytes(f, 3)
    assert gloo > 1.3 * f["sent"] and abs(lab.wire_ratio(f) * f["sent"] / gloo - 1) < 0.03
    f["nic_payload"] = [b * 1.2 for b in f["nic_payload"]]
    assert "FSDP2's busiest NIC sent" in _failed(lab.fsdp_bytes_check(x))


def test_the_timeline_sentence_says_what_ran_during_backward():
    from kit.plots.ddp import plot_overlap_step
    x = _lab_run()
    x["paired"]["comm"]["ms"] = 40.0
    x["timeline"] = {"rank": 2, "forward": 2.0, "backward": 6.0, "summed": 50.0, "end": 52.0, "allreduces": [
        {"bytes": 40, "launched": 2.5, "done": 5.0}, {"bytes": 589824, "launched": 3.0, "done": 30.0},
        {"bytes": 393216, "launched": 5.5, "done": 50.0}]}
    text = lab.timeline_text(x)
    assert "forward ended at 2.0 ms and backward at 6.0 ms, its hooks having launched all 3 allreduces" in text
    assert "the first (40 bytes), launched at 2.5 ms, was done at 5.0 ms, and 1 of the 3 were done before" in text
    assert "the last was done at 50.0 ms, and the step ended at 52.0 ms" in text
    assert "took 47.5 ms beside the compute, 1.19× the 40.0 ms they took alone" in text
    ax = plot_overlap_step(x)
    assert len(ax.get_yticks()) == 3 + 2
    import matplotlib.pyplot as plt
    plt.close(ax.figure)


def test_bucket_sizes_with_the_same_count_are_compared_against_the_lesson():
    x = _ddp_run()
    rows = [r for r in x["rows"] if r["scheme"].startswith("buckets:")]
    most = max(r["calls"] for r in rows)
    twin_a, twin_b = sorted(rows, key=lambda r: -r["calls"])[:2]
    twin_b["calls"] = most                                              # two sizes with one count, as 16 KB and
    #                                                                    256 KB had under a 1 MiB first bucket
    twin_a["step_ms"], twin_b["step_ms"] = 40.0, 30.0
    many, _ = lessons.bucket_extremes(x)
    assert many is twin_b                                               # the faster of the two, not the first
    said = checks.markdown([lessons.buckets_check(x)])
    assert f"{twin_a['label']} and {twin_b['label']} both made {most} allreduces, yet their medians were 10.0 ms " \
           "apart: that much is this run's noise" in said.replace("Buckets", "buckets")
    twin_a["calls"] = most - 1
    assert "both made" not in checks.markdown([lessons.buckets_check(x)])


def test_the_lab_table_sets_its_compute_alone_beside_the_loopback_runs():
    x, loop = _lab_run(), _ddp_run()
    here = next(r for r in x["rows"] if r["scheme"] == "local")["step_ms"]
    there = next(r for r in loop["rows"] if r["scheme"] == "local")["step_ms"]
    text = lab.table(x, loopback=loop)
    assert f"Compute alone took {here:.1f} ms a step here and {there:.1f} ms in section 4 on loopback" in text
    assert "Compute alone" not in lab.table(x)


def test_the_bucket_check_takes_the_slowest_of_the_fewest_and_names_middle_ties_without_the_clause():
    row = lambda kb, calls, ms: {"scheme": f"buckets:{kb << 10}", "label": f"buckets {kb} KB", "calls": calls,  # noqa: E731
                                 "step_ms": ms}
    x = {"rows": [row(16, 5, 30.0), row(256, 3, 27.0), row(512, 3, 26.0), row(1024, 2, 24.0), row(4096, 2, 25.0)]}
    many, few = lessons.bucket_extremes(x)
    assert many["label"] == "buckets 16 KB" and few["label"] == "buckets 4096 KB"      # the slower of the fewest
    said = lessons.twins(x)
    assert "buckets 256 KB and buckets 512 KB both made 3 allreduces" in said and "2 allreduces" in said
    assert said.endswith("so the check compares the fastest of the most-messages settings with the slowest of the "
                         "fewest")
    x["rows"].pop()                                                   # the tie left is at a count the check skips
    assert "both made 3" in lessons.twins(x) and "so the check compares" not in lessons.twins(x)
    x["rows"].append(row(768, 3, 26.5))
    assert "buckets 256 KB and buckets 512 KB and buckets 768 KB all made 3 allreduces" in lessons.twins(x)
