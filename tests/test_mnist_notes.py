"""Notebook 04's and appendix 04a's checks, numbers in and kit.checks.Check out: the linear scaling rule and the
accuracy lesson (kit.mnist.accuracy), the lab section (kit.mnist.lab.claims), the elastic run
(kit.mnist.elastic.run_checks), the timeline's overlap and the scaling pairs' noise band (kit.mnist.timeline,
kit.mnist.throughput); each made to hold and to fail on synthetic numbers."""
import pytest

from kit import checks
from kit.mnist import accuracy, elastic, lab, throughput, timeline

RUN = dict(workers=2, epochs=12, acc_n=0.867, acc_1=0.864)
SEEDS = {"2_workers": [0.861, 0.862, 0.863], "1_process": [0.860, 0.864, 0.868]}        # median within: held
BEHIND = {"2_workers": [0.850, 0.852, 0.861], "1_process": [0.860, 0.864, 0.868]}       # median 85.2% below 86.0%


def test_the_scaling_rule_holds_within_two_points_and_fails_beyond():
    held, broke = accuracy.scaling_checks(0.97, {4: 0.98, 16: 0.793})
    assert held.held and not broke.held and broke.measured == pytest.approx(79.3) and broke.bound == "≥ 95.0%"
    assert accuracy.scaling_checks(0.97, {4: 0.955})[0].held                          # 1.5 points: within


def test_the_run_and_the_seeds_hold_and_fail():
    this, seeds = accuracy.run_checks(RUN, SEEDS)
    assert this.held and seeds.held and this.bound == "≥ 86.00%"
    low = accuracy.run_checks(dict(RUN, acc_n=0.855), BEHIND)
    assert [c.held for c in low] == [False, False]
    assert accuracy.run_checks(RUN, None) == []
    longer = {**BEHIND, "long": {"epochs": 24, "2_workers": [0.863, 0.868, 0.87], "1_process": [0.864, 0.869, 0.87]}}
    assert [c.held for c in accuracy.run_checks(RUN, longer)] == [True, False, True]
    assert accuracy.run_checks(RUN, longer)[2].name.startswith("24 epochs")


def test_the_control_arm_holds_inside_the_workers_range_and_fails_outside():
    inside = {**SEEDS, accuracy.CONTROL: [0.858, 0.862, 0.866]}
    assert accuracy.seeds_checks(inside, 12)[1].held
    outside = {**SEEDS, accuracy.CONTROL: [0.85, 0.852, 0.856]}
    control = accuracy.seeds_checks(outside, 12)[1]
    assert not control.held and control.bound == "86.10–86.30%"
    result = {"epochs": 12, "accuracy_seeds": outside, "accuracy_long": None}
    assert [c.held for c in accuracy.bench_checks(result)] == [True, False]


def _lab_run(n, rate, speedup, step_s, allreduce_s, busy=0.99):
    return dict(n=n, rate=rate, samples_per_s=1000 * speedup, speedup=speedup, step_s=step_s, allreduce_s=allreduce_s,
                allreduce_share=allreduce_s / step_s, link_s=0.0384, cores_busy=[busy] * n, steps=30, batch=128)


ONE = {"n": 1, "samples_per_s": 1000.0, "step_s": 0.128, "allreduce_s": 0.0, "cores_busy": [1.0]}


def test_the_lab_checks_hold_and_fail():
    good = {"gradient_bytes": 4_800_000, "one_worker": ONE,
            "runs": [_lab_run(2, "1gbit", 1.50, 0.1707, 0.050), _lab_run(2, "10gbit", 1.90, 0.1347, 0.020)]}
    gap, only = lab.claims(good)
    assert gap.held and only.held and gap.measured == pytest.approx(1.27) and only.measured == pytest.approx(42.7)
    hidden = {**good, "runs": [_lab_run(2, "1gbit", 1.78, 0.164, 0.030), _lab_run(2, "10gbit", 1.84, 0.120, 0.022)]}
    gap, only = lab.claims(hidden)
    assert not gap.held and not only.held                          # 1.03x; a step 36 ms over one worker's, 30 ms
    assert lab.numbers(good)["hidden_share_1gbit"] == pytest.approx(1 - (0.1707 - 0.128) / 0.050, abs=1e-3)


def test_the_elastic_checks_hold_and_fail():
    run = dict(lost_batches=[6], commit_every=10, seconds_to_carry_on=21.2, final_accuracy=0.91)
    assert all(c.held for c in elastic.run_checks(run))
    bad = dict(lost_batches=[10], commit_every=10, seconds_to_carry_on=None, final_accuracy=0.3)
    assert [c.held for c in elastic.run_checks(bad)] == [False, False, False]
    assert not elastic.run_checks(dict(run, lost_batches=[2, 3]))[0].held              # two losses, not one


def test_the_overlap_check_fails_when_every_allreduce_starts_at_the_end():
    assert timeline.overlap_check(2, 8).held and timeline.overlap_check(2, 8).measured == 6
    assert not timeline.overlap_check(8, 8).held


def test_a_speed_up_inside_the_noise_band_is_no_gain():
    runs = [dict(thr_1=2405.0, thr_n=2263.0), dict(thr_1=2177.0, thr_n=2159.0), dict(thr_1=2172.0, thr_n=2194.0),
            dict(thr_1=2120.0, thr_n=2175.0), dict(thr_1=2161.0, thr_n=2219.0)]      # results/mnist.json's defaults
    noise = throughput.gain_check("TF defaults", runs, 1.01)
    assert not noise.held and noise.bound == "> 1.13 (1 + noise)"                      # 0.99x-1.04x: noise
    assert throughput.gain_check("pinned", runs, 1.84).held
    assert throughput.model_check(2245.0, 2039.0).held and not throughput.model_check(1700.0, 2039.0).held
    assert "**no**" in checks.table([noise])
