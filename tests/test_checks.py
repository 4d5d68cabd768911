"""kit.checks (a lesson checked on a run, as a value, and its one renderer) and every check of notebook 05
(kit.ddp.lessons, kit.ddp.memory, kit.ddp.lab): each holds on a recorded run where its numbers say so and is forced
to fail (held False, "**no**" in its table row). Pure Python on the committed results/ddp.json and
results/ddp_lab.json."""
import copy
import json
from pathlib import Path

import pytest

from kit import checks
from kit.checks import Check
from kit import ddp
from kit.ddp import lab, lessons, memory
from kit.netlab.counters import MSS

RESULTS = Path(__file__).parent.parent / "results"


def _ddp_run() -> dict:
    """The committed `python -m kit.bench ddp` run, with a ZeRO-1 row of 64 KB pieces (a copy of its 4 MiB row)
    and a peak on the ZeRO-1 and FSDP2 rows at their formulas (ZeRO-1's with its ring's two receive buffers)."""
    x = copy.deepcopy(json.loads((RESULTS / "ddp.json").read_text()))
    N, K = x["N"], x["K"]
    if not any(r["scheme"].startswith("zero:") for r in x["rows"]):
        zero = next(r for r in x["rows"] if r["scheme"] == "zero")
        x["rows"].insert(x["rows"].index(zero) + 1, {**copy.deepcopy(zero), "scheme": "zero:65536",
                                                     "label": "ZeRO-1, ring pieces of 64 KB"})
    for r in x["rows"]:
        kind, _, arg = r["scheme"].partition(":")
        if kind in ("zero", "fsdp"):
            shard = K // N
            parts = {"params": K if kind == "zero" else shard, "grads": K if kind == "zero" else shard,
                     "optimizer": shard, "temporary": memory.scratch_bytes(x, int(arg or 4 << 20)) if kind == "zero"
                     else 0}
            r["peak"] = {**parts, "total": sum(parts.values())}
    return x


def _lab_run(N: int = 3) -> dict:
    """A recorded run of `python -m kit.bench ddp_lab` (the committed results), to force each check both ways."""
    doc = json.loads((RESULTS / "ddp_lab.json").read_text())
    return copy.deepcopy(next(x for x in doc["runs"] if x["N"] == N))


def _one(found: list[Check], name: str) -> Check:
    return next(c for c in found if c.name == name)


def _failed(c: Check) -> str:
    """Render a check that must have failed; return its table row after reading "**no**" in it."""
    row = checks.table([c]).splitlines()[-1]
    assert not c.held and row.endswith("| **no** |") and f"{c.name} did not hold" in checks.summary_line([c]), row
    return row


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


# ----------------------------------------------------------------------------------- sections 1, 2, 6, 7
def test_the_weights_check_holds_within_its_tolerance_and_fails_beyond_it():
    ok = lessons.weights_check("naive hooks", [1e-7, 3e-7, 2e-7])
    assert ok.held and ok.measured == 3e-7 and ok.bound == "< 1e-05"
    assert "| naive hooks: max abs(Δw) over ranks | 0.00200 | < 1e-05 | **no** |" in _failed(
        lessons.weights_check("naive hooks", [1e-7, 2e-3, 2e-7]))
    assert lessons.weights_check("fp16", [5e-4], tol=1e-3).held


def test_the_zero_step_checks_want_one_process_weights_and_a_shard_of_momentum_per_rank():
    ok = lessons.zero_step_checks([2e-7, 1e-7, 3e-7], [4, 4, 4], numel=10)
    assert all(c.held for c in ok) and ok[1].measured == ok[1].bound == 4
    bad = lessons.zero_step_checks([2e-7, 4e-2, 3e-7], [10, 4, 4], numel=10)
    _failed(bad[0])
    assert "| 10 | 4 | **no** |" in _failed(bad[1])                # the rank farthest from ⌈K/N⌉


def test_the_fsdp_shard_check_follows_torch_chunk_on_dimension_0():
    full = [(10, 4), (10,), (3, 2)]
    local = [[(4, 4), (4,), (1, 2)], [(4, 4), (4,), (1, 2)], [(2, 4), (2,), (1, 2)]]
    found = lessons.fsdp_shard_checks(local, full)
    assert all(c.held for c in found) and [c.measured for c in found] == [22, 22, 12]
    local[1] = [(4, 4), (4,), (3, 2)]                          # a rank holding the whole of a parameter
    assert "| FSDP2: parameters on rank 1 | 26 | 22 | **no** |" in _failed(lessons.fsdp_shard_checks(local, full)[1])
    assert lessons.fsdp_shard_checks([[(2,)], [(0,)], [(0,)]], [(2,)])[2].held       # 1 row each: the last none


# ----------------------------------------------------------------------------------- sections 4-7 (kit.ddp.lessons)
def test_every_lesson_holds_or_fails_on_the_recorded_run_as_its_numbers_say():
    x = _ddp_run()
    found = lessons.all_checks(x)
    assert [c.name for c in found][:3] == ["schemes with one process's weights", "7 → 1 allreduces: step saved",
                                          "7 → 1 allreduces: pairs of steps won"]
    assert [c.name for c in found][3:] == [
        "α–β model: saving measured / model", "overlap on loopback: overlapped / naive step",
        "fp16 hook: bytes handed / DDP's", "peak share: ZeRO-1 (reduce-scatter, all-gather)",
        "peak share: ZeRO-1, ring pieces of 64 KB", "peak / DDP's: ZeRO-1, ring pieces of 64 KB",
        "peak share: FSDP2 fully_shard"]
    assert all(c.held for c in found if c.name.startswith(("schemes", "fp16", "peak")))   # not timings: always
    line = checks.summary_line(found)                    # the timing rows hold or not as the run's numbers say
    assert all((f"{c.name} did not hold" in line) is not c.held for c in found)


def test_the_correct_check_fails_when_a_scheme_ends_with_other_weights():
    x = _ddp_run()
    row = next(r for r in x["rows"] if r["scheme"] == "overlap")
    row["ok"], row["err"] = False, 0.5
    assert "| schemes with one process's weights | 11 | 12 | **no** |" in _failed(lessons.correct_check(x))


def test_the_bucket_checks_fail_when_fewer_messages_are_slower_or_inside_the_spread():
    x = _ddp_run()
    many, few = lessons.bucket_extremes(x)
    few["step_ms"] = many["step_ms"] + 5
    _failed(lessons.buckets_checks(x)[0])
    x = _ddp_run()
    many, few = lessons.bucket_extremes(x)
    many.update(step_ms=30.0, steps_ms=[24.0, 29.0, 30.0, 31.0, 38.0])
    few.update(step_ms=28.0, steps_ms=[22.0, 27.0, 28.0, 32.0, 37.0])           # a lower median, the same spread
    assert lessons.win_rate(few["steps_ms"], many["steps_ms"]) == 0.6
    saved, won = lessons.buckets_checks(x)
    assert saved.held and saved.measured == 2.0
    assert "| 0.600 | ≥ 0.75 | **no** |" in _failed(won)
    few.update(steps_ms=[22.0, 23.0, 28.0, 28.5, 29.0])
    assert lessons.buckets_checks(x)[1].held and lessons.buckets_checks(x)[1].measured == pytest.approx(0.86)


def test_the_bucket_saving_must_exceed_twice_the_same_count_noise():
    x = _ddp_run()
    rows = sorted((r for r in x["rows"] if r["scheme"].startswith("buckets:")), key=lambda r: -r["calls"])
    rows[1]["calls"] = rows[0]["calls"]                        # two sizes with the most allreduces, one count
    rows[0].update(step_ms=30.0, steps_ms=[29.0, 30.0, 31.0])
    rows[1].update(step_ms=33.0, steps_ms=[32.0, 33.0, 34.0])      # 3 ms apart: this run's noise
    few = lessons.bucket_extremes(x)[1]
    few.update(step_ms=25.0, steps_ms=[24.0, 25.0, 26.0])     # 5 ms saved: under twice the noise
    assert lessons.bucket_extremes(x)[0] is rows[0] and lessons.noise_ms(x) == 3.0
    assert "| 5.00 ms | ≥ 6.0 ms | **no** |" in _failed(lessons.buckets_checks(x)[0])
    few.update(step_ms=23.0)
    assert lessons.buckets_checks(x)[0].held


def test_the_model_check_fails_when_the_saving_is_far_from_the_models():
    x = _ddp_run()
    many, few = lessons.bucket_extremes(x)
    model = many["model_comm_ms"] - few["model_comm_ms"]
    for factor, held in ((0.1, False), (10, False), (1.5, True), (0.6, True)):
        few["step_ms"] = many["step_ms"] - factor * model
        c = lessons.model_check(x)
        assert c.held is held and c.measured == pytest.approx(factor) and c.bound == "0.50–2.00", factor
    few["step_ms"] = many["step_ms"] - 10 * model
    _failed(lessons.model_check(x))


def test_the_overlap_and_fp16_checks_fail_when_their_numbers_say_so():
    x = _ddp_run()
    rows = {r["scheme"]: r for r in x["rows"]}
    assert lessons.overlap_check(x).held and lessons.fp16_check(x).held
    rows["overlap"]["step_ms"] = rows["naive"]["step_ms"] + 1
    _failed(lessons.overlap_check(x))
    fp16 = next(r for r in x["rows"] if r["scheme"].startswith("ddp_fp16:"))
    fp16["handed"] *= 2
    assert "| 1.00 | 0.50 ± 0.01 | **no** |" in _failed(lessons.fp16_check(x))


def test_the_sweep_and_alpha_rows_are_the_runs_numbers():
    x = _ddp_run()
    rows = lessons.sweep_rows(x)
    assert [r["allreduces"] for r in rows] == [7, 6, 3, 1] and rows[0]["median ms"] == lessons.bucket_extremes(x)[0][
        "step_ms"]
    (ab,) = lessons.alpha_rows(x)
    assert ab["α µs"] == pytest.approx(x["alpha_s"] * 1e6) and ab["calls"] == x["allreduce_1float"]["repeats"]
    table = ddp.md(rows).splitlines()
    assert table[0] == "| bucket | allreduces | median ms | fastest | slowest | model ms |" and len(table) == 6
    assert ddp.md([]) == ""


# ----------------------------------------------------------------------------------- memory (kit.ddp.memory)
def test_the_memory_check_fails_when_a_sharded_schemes_peak_exceeds_its_bound():
    x = _ddp_run()
    fsdp = next(r for r in x["rows"] if r["scheme"] == "fsdp")
    fsdp["peak"]["grads"] = x["K"]                        # the full gradient alive at once: not ZeRO-3
    fsdp["peak"]["total"] = sum(v for k, v in fsdp["peak"].items() if k != "total")
    _failed(_one(memory.memory_checks(x), "peak share: FSDP2 fully_shard"))


def test_zero1s_memory_check_fails_when_its_step_holds_a_full_flat_copy():
    x = _ddp_run()
    zero = next(r for r in x["rows"] if r["scheme"] == "zero")
    assert _one(memory.memory_checks(x), "peak share: ZeRO-1 (reduce-scatter, all-gather)").held
    scratch = memory.scratch_bytes(x)
    assert scratch == 2 * 4 * -(-x["K"] // 4 // x["N"])                  # 4 MiB pieces: larger than a chunk here
    assert memory.bound(zero, x) == pytest.approx(1.0)                   # 2K + K/N + 2K/N at N = 3: DDP's 3K
    zero["peak"]["temporary"] += x["K"]                    # a step that copies the whole gradient beside .grad
    zero["peak"]["total"] += x["K"]
    _failed(_one(memory.memory_checks(x), "peak share: ZeRO-1 (reduce-scatter, all-gather)"))


def test_zero1_with_small_pieces_must_hold_less_than_ddp():
    x = _ddp_run()
    small = next(r for r in x["rows"] if r["scheme"] == "zero:65536")
    assert memory.scratch_bytes(x, 64 << 10) == 2 * (64 << 10)            # two pieces, whatever the model
    c = _one(memory.memory_checks(x), "peak / DDP's: ZeRO-1, ring pieces of 64 KB")
    assert c.held and c.measured == pytest.approx(2 / 3 + 1 / 9 + 2 * (64 << 10) / (3 * x["K"]), rel=1e-3)
    small["peak"]["total"] = next(r for r in x["rows"] if r["scheme"].startswith("ddp:"))["peak"]["total"]
    _failed(_one(memory.memory_checks(x), "peak / DDP's: ZeRO-1, ring pieces of 64 KB"))


def test_the_memory_table_puts_each_scheme_beside_its_stages_formula_and_temporaries():
    x = _ddp_run()
    rows = memory.memory_table(x).splitlines()[2:]
    assert all(("| ≥ " in row) == any(k in row for k in ("Horovod", "fp16")) for row in rows), rows
    stages = [int(row.split("|")[1]) for row in rows]
    assert stages == sorted(stages) and stages.count(2) == 1             # stage 2: its formula alone
    zero = next(row for row in rows if "| ZeRO-1 (reduce" in row)
    ring = memory.scratch_bytes(x) / (3 * x["K"])
    assert f"| 1 | ZeRO-1 (reduce-scatter, all-gather) | {memory.formula(1, x['N']):.3f} | {ring:.3f} | 1.000 |" in zero
    layer = 2 * memory.unit_bytes(x) / (3 * x["K"])
    assert f"| 3 | FSDP2 fully_shard | {1 / x['N']:.3f} | {layer:.3f} |" in rows[-1]
    assert "| 0 | buckets 16 KB | 1.000 | 0.333 | 1.333 |" in memory.memory_table(x)   # its flat copies: + K
    assert memory.formula(1, 4) == pytest.approx((2 + 0.25) / 3) and memory.formula(3, 4) == 0.25


# ----------------------------------------------------------------------------------- section 8 (kit.ddp.lab)
def test_the_overlap_checks_read_the_interleaved_rounds():
    x = _lab_run()
    p = x["paired"]
    for k, ms in {"local": 20.0, "forward": 4.0, "step": 2.0, "comm": 60.0, "naive": 80.0, "overlap": 68.0,
                  "local_sleep": 22.0, "overlap_sleep": 67.0}.items():
        p[k]["ms"] = ms
    ratio, sleeping = lab.overlap_checks(x)
    assert ratio.held and ratio.measured == pytest.approx(68 / 60) and ratio.bound == "≤ 1.15"
    assert sleeping.held and sleeping.measured == pytest.approx(15 / 16)        # 15 of the 16 ms it could hide
    rounds = {r["round"]: r["median ms"] for r in lab.rounds_rows(x)}
    assert rounds["backward"] == 14.0 and rounds["best overlap"] == 66.0      # 4 + max(14, 60) + 2
    p["overlap"]["ms"] = 79.0                               # nothing hidden: compute + comm
    assert "| 1.32 | ≤ 1.15 | **no** |" in _failed(lab.overlap_checks(x)[0])
    p["overlap_sleep"]["ms"] = 77.0                         # free cores hid 5 of 16 ms: under half
    assert "| 0.312 | ≥ 0.50 | **no** |" in _failed(lab.overlap_checks(x)[1])


def test_the_wire_checks_hold_on_the_recorded_run_and_fail_when_the_bytes_are_off():
    x = _lab_run()
    found = lab.claims(x)
    assert [c.name for c in found][2:5] == ["fp16 hook: NIC bytes / DDP's",
                                            "NIC payload / ring model: naive: one allreduce per gradient",
                                            "FSDP2: NIC payload / model (Gloo's reduce-scatter)"]
    assert all(c.held for c in found[2:])
    rows = {r["scheme"]: r for r in x["rows"]}
    fp16 = next(r for s, r in rows.items() if s.startswith("ddp_fp16:"))
    fp16["nic_tx"] = [b * 1.1 for b in fp16["nic_tx"]]       # 0.55× DDP's bytes: not half
    _failed(lab.fp16_check(x))
    x = _lab_run()
    rows = {r["scheme"]: r for r in x["rows"]}
    rows["zero"]["nic_payload"] = [b * 1.05 for b in rows["zero"]["nic_payload"]]   # 5% more than the ring's
    assert "ZeRO" in _failed(lab.bytes_check(x))
    rows["zero"]["nic_retrans"] = [0.05 * rows["zero"]["sent"] / MSS] * 3              # ... all of it resent
    assert lab.bytes_check(x).held
    f = rows["fsdp"]                                        # Gloo: every reduce-scatter costs an allreduce
    gloo = lab.gloo_bytes(f, 3)
    assert gloo > 1.3 * f["sent"] and abs(lab.wire_ratio(f) * f["sent"] / gloo - 1) < 0.03
    f["nic_payload"] = [b * 1.2 for b in f["nic_payload"]]
    _failed(lab.fsdp_bytes_check(x))


def test_the_timeline_rows_say_what_ran_during_backward():
    from kit.plots.ddp import plot_overlap_step
    x = _lab_run()
    x["paired"]["comm"]["ms"] = 40.0
    x["timeline"] = {"rank": 2, "forward": 2.0, "backward": 6.0, "summed": 50.0, "end": 52.0, "allreduces": [
        {"bytes": 40, "launched": 2.5, "done": 5.0}, {"bytes": 589824, "launched": 3.0, "done": 30.0},
        {"bytes": 393216, "launched": 5.5, "done": 50.0}]}
    (t,) = lab.timeline_rows(x)
    assert (t["1st launched"], t["1st done"], t["done in backward"], t["allreduces"], t["last done"]) == \
        (2.5, 5.0, 1, 3, 50.0)
    assert t["span / alone"] == pytest.approx(47.5 / 40)
    ax = plot_overlap_step(x)
    assert len(ax.get_yticks()) == 3 + 2
    import matplotlib.pyplot as plt
    plt.close(ax.figure)


def test_the_lab_table_sets_its_compute_alone_beside_the_loopback_runs():
    x, loop = _lab_run(), _ddp_run()
    there = next(r for r in loop["rows"] if r["scheme"] == "local")["step_ms"]
    text = lab.table(x, loopback=loop)
    assert text.splitlines()[-1] == f"| compute only, on loopback (section 4) | {there:.1f} | 0 | – | – | – |"
    assert "loopback" not in lab.table(x)
