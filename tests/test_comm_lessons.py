"""kit.comm.lessons: the checks of notebooks 02 and 03 (and appendices 02a and 03a) are numbers; each is made to
hold and to fail here."""
import pytest

from kit import checks
from kit.comm import lessons


def rows(seconds, model):
    return {n: {"seconds": s, "model_s": m} for n, s, m in zip((2, 3, 4), seconds, model)}


def test_equal_check_fails_on_one_difference_and_on_nothing_compared():
    assert lessons.equal_check("correct", {"a": True, "b": True}).held
    bad = lessons.equal_check("correct", {"a": True, "rank 1, float16": False})
    assert not bad.held and bad.measured == "1 of 2"
    assert not lessons.equal_check("correct", {}).held          # nothing compared is not a pass


def test_bytes_and_nic_checks_fail_off_the_formula():
    assert lessons.bytes_check("bytes", [100, 101], 100, 4).held
    off = lessons.bytes_check("bytes", [100, 140], 100, 4)
    assert not off.held and off.measured == 40
    assert lessons.nic_check("server NIC", 1.002e6, 1e6).held
    assert not lessons.nic_check("server NIC", 1.05e6, 1e6).held
    assert not lessons.nic_check("server NIC", 0.9e6, 1e6).held


def test_growth_holds_within_the_tolerance_and_fails_outside_it():
    held = lessons.growth_check("one server", rows((1.0, 1.5, 2.1), (1.0, 1.5, 2.0)), 2, 4)    # 2.1x vs 2.0x
    assert held.held and held.measured == pytest.approx(2.1) and held.bound == "2.00 ± 25%"
    bad = lessons.growth_check("the ring", rows((0.5, 0.9, 1.2), (0.5, 0.6, 0.75)), 2, 4)      # 2.4x vs 1.5x
    assert not bad.held and "**no**" in checks.table([bad])


def test_a_difference_inside_the_noise_band_is_not_a_ranking():
    assert lessons.slower_check("ring / server", 5.7, 1.9).held
    assert not lessons.slower_check("ring / server", 1.05, 1.0).held      # 5% slower: noise, not slower
    assert not lessons.slower_check("ring / server", 0.9, 1.0).held
    assert lessons.same_check("off / on", 1.05, 1.0).held
    assert not lessons.same_check("off / on", 1.8, 1.0).held and not lessons.same_check("off / on", 0.5, 1.0).held


def test_the_ring_losing_small_messages_can_fail():
    assert lessons.small_k_check(rows((1e-3, 4e-3, 6e-3), (0, 0, 0)), rows((1e-3, 2e-3, 2e-3), (0, 0, 0))).held
    assert not lessons.small_k_check(rows((1e-3, 2e-3, 2e-3), (0, 0, 0)), rows((1e-3, 4e-3, 6e-3), (0, 0, 0))).held


def test_each_straggler_check_can_fail():
    assert all(c.held for c in lessons.straggler_checks(19.2, -0.5, 20))
    sync, asyn = lessons.straggler_checks(2.0, 1.0, 20)            # the synchronous server did not wait
    assert not sync.held and asyn.held
    sync, asyn = lessons.straggler_checks(20.0, 15.0, 20)          # the asynchronous one slowed down too
    assert sync.held and not asyn.held


def test_the_appendix_checks_can_fail():
    assert lessons.refined_check(10, 14).held and not lessons.refined_check(6, 14).held
    assert lessons.refined_check(10, 14).bound == "≥ 10 of 14"
    assert lessons.own_line_check(22.3e-3, 21.0e-3).held
    assert not lessons.own_line_check(38.2e-3, 22.4e-3).held and not lessons.own_line_check(10e-3, 22.4e-3).held
    assert lessons.above_model_check("ring N=4 / N=2", 2.75, 1.56).held
    assert not lessons.above_model_check("ring N=4 / N=2", 1.41, 1.57).held


def test_the_benchmarks_summaries_say_which_checks_did_not_hold():
    """The ps, allreduce, ring_cpu and network summaries end in their checks: the committed runs as recorded, and
    each made to fail by spoiling one number of it."""
    import copy
    import json
    from pathlib import Path

    from kit.bench import allreduce, ps, ring_cpu
    from kit.plots import network
    results = Path(__file__).resolve().parent.parent / "results"
    x = {n: json.loads((results / f"{n}.json").read_text()) for n in ("ps", "allreduce", "ring_cpu", "network")}
    assert ps.summary(x["ps"]) == x["ps"]["summary"] and allreduce.summary(x["allreduce"]) == x["allreduce"]["summary"]
    net = lambda y: network.summary(y, max(y["sizes"]), y["seconds"])     # noqa: E731
    assert net(x["network"]) == x["network"]["summary"]

    bad = copy.deepcopy(x["allreduce"])
    for r in bad["records"]:
        r["busbw"] *= 0.1 if r["impl"] == "kit ring" else 1
    assert "kit ring busbw / best Horovod's at 64 MB did not hold" in allreduce.summary(bad)
    bad = copy.deepcopy(x["ps"])
    bad["training"][0]["bytes_exact"] = False
    assert "server bytes/step = N·K/k (every run) did not hold" in ps.summary(bad)
    rows = copy.deepcopy(x["ring_cpu"]["rows"])
    for r in rows:
        r["busbw_share"] *= 0.5 if r["impl"] == "ring" and r["N"] == 2 else 1
    assert "N=2: kit ring / torch.distributed busbw did not hold" in ring_cpu.summary(rows)
    bad = copy.deepcopy(x["network"])
    for r in bad["rows"]:
        r["seconds"] *= 2 if r["impl"] == "ring" and r["N"] == max(bad["ns"]) else 1
    said = net(bad)
    n_lo, n_hi = min(bad["ns"]), max(bad["ns"])
    assert "ring measured/model (every N) did not hold" in said
    assert f"ring t(N={n_hi}) / t(N={n_lo}) did not hold" in said
