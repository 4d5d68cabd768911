"""Notebook 04's prose from its runs' numbers: the linear scaling rule's and the accuracy lesson's checks
(kit.mnist.accuracy), the elastic run's account (kit.mnist.elastic.note), the lab section (kit.mnist.lab.note) and
the closing summary (kit.mnist.summary); appendix 04a's (kit.mnist.step_time); on synthetic numbers, every check
made to hold and to fail."""
from kit.checks import markdown
from kit.mnist import BATCH, accuracy, elastic, lab, step_time, summary

RUN = dict(workers=2, epochs=12, n_train=6000, dataset="fashion_mnist", acc_n=0.867, acc_1=0.864, steps_n=24,
           steps_1=47, seconds_n=39.2, seconds_1=66.4)
SEEDS = {"2_workers": [0.861, 0.862, 0.863], "1_process": [0.860, 0.864, 0.868]}        # median within: held
BEHIND = {"2_workers": [0.850, 0.852, 0.861], "1_process": [0.860, 0.864, 0.868]}       # median 85.2% below 86.0%


def test_the_scaling_rule_holds_within_two_points_and_says_why_it_broke():
    held, broke = accuracy.scaling_checks(0.97, {4: 0.98, 16: 0.793}, 8, 0.1, 8000)
    assert held.held and not broke.held
    text = accuracy.scaling_note(0.97, {4: 0.945, 16: 0.824}, {4: 0.98, 16: 0.793}, 8, 0.1, 8000)
    for number in ("8,000 samples", "batch 8 reached 97.0%", "×4 reached 94.5%", "×16 reached 82.4%", "98.0%",
                   "79.3%", "within 2 points of the base batch's 97.0%"):
        assert number in text
    assert "**the linear scaling rule at batch ×4** held" in text
    assert "**the linear scaling rule at batch ×16** **did not hold**" in text
    assert "62 steps of 128 samples at learning rate 1.6 fell 17.7 points short of 1,000 steps of 8 at 0.1" in text
    assert "did not hold" not in accuracy.scaling_note(0.97, {4: 0.9}, {4: 0.955}, 8, 0.1, 8000)   # 1.5 points


def test_the_lesson_held_on_this_run_and_over_the_seeds():
    checks = accuracy.run_checks(RUN, SEEDS)
    assert [c.held for c in checks] == [True, True]
    text = accuracy.run_note(RUN, SEEDS, checks)
    for number in ("12 epochs on 6,000 fashion_mnist images", "**2 workers 86.7%**", "**one process 86.4%**",
                   f"24 steps of 2 × {BATCH} images", f"47 steps of {BATCH} per epoch", "39 s", "66 s", "+0.3 points",
                   "trained 3 seeds", "2 workers 86.1%–86.3%", "one process 86.0%–86.8%", "at least 86.0%"):
        assert number in text
    assert "did not hold" not in text and "fell outside" not in text and "TRAIN_SAMPLES" not in text


def test_the_lesson_did_not_hold_on_this_run_says_why_and_what_more_epochs_showed():
    run = dict(RUN, acc_n=0.851, acc_1=0.870)                                # below 86.0%, one process above range
    checks = accuracy.run_checks(run, SEEDS)
    assert [c.held for c in checks] == [False]
    text = accuracy.run_note(run, SEEDS, checks)
    assert "on this run** **did not hold**" in text
    assert "the job took 288 optimizer steps against one process's 564 (2× fewer" in text
    assert "fell below their own 3 seeds too (86.1%–86.3%)" in text and "did not catch up" in text
    near = accuracy.run_checks(dict(run, acc_n=0.859), SEEDS)[0]        # 0.2 points under seeds 0.2 wide: spread
    assert not near.held and "fell 0.2 points below the range of their own 3 seeds (86.1%–86.3%)" in near.reason
    assert "run-to-run spread" in near.reason and "did not catch up" not in near.reason
    assert "This run's one process (87.0%) fell outside that range: 3 seeds" in text
    assert "`TRAIN_SAMPLES = None`" in text                                     # no long runs to say more
    caught = {"epochs": 48, "2_workers": [0.88, 0.881, 0.882], "1_process": [0.879, 0.881, 0.883]}
    checks = accuracy.run_checks(run, {**SEEDS, "long": caught})
    assert [c.held for c in checks] == [False, True]
    text = accuracy.run_note(run, {**SEEDS, "long": caught}, checks)
    assert "**with 4× the epochs (48) the workers catch up** held: 2 workers 88.0%–88.2%" in text
    assert "12 epochs on these images stop short of that" in text and "TRAIN_SAMPLES" not in text
    behind = {"epochs": 48, "2_workers": [0.85, 0.86, 0.88], "1_process": [0.879, 0.881, 0.883]}
    long = accuracy.long_check(behind, 12, 2)
    assert not long.held and "their 2-worker median, 86.0%, is below one process's range" in markdown([long])


def test_the_lesson_held_here_but_not_over_the_seeds():
    checks = accuracy.run_checks(RUN, BEHIND)
    assert [c.held for c in checks] == [True, False]
    text = accuracy.run_note(RUN, BEHIND, checks)
    assert "over the benchmark's seeds** **did not hold**" in text
    assert "their 2-worker median, 85.2%, is below one process's range" in text
    assert "This run fell on the good side of the spread." in text
    assert "`TRAIN_SAMPLES = None`" in text


def test_the_lesson_without_seeds_says_one_run_cannot_tell():
    assert accuracy.run_checks(RUN, None) == []
    text = accuracy.run_note(RUN, None, [])
    assert "holds no seeds" in text and "**2 workers 86.7%**" in text and "did not hold" not in text


def test_the_control_arm_is_told_when_the_seeds_have_one():
    seeds = {**SEEDS, accuracy.CONTROL: [0.861, 0.862, 0.864]}
    text = accuracy.run_note(RUN, seeds, accuracy.run_checks(RUN, seeds))
    assert "The benchmark's control arm: one process trained as the 2 workers are" in text


ELASTIC = {"seconds_to_carry_on": 21.04, "commit_every": 10, "seconds_to_rejoin": 7.62,
           "batches_at_size": {1: 90, 2: 529}, "final_accuracy": 0.9104}


def test_the_elastic_note_tells_the_runs_numbers():
    text = elastic.note(ELASTIC, "This run", 25, 5, (21.03, 6.49))
    for number in ("This run, h2's link was cut after 25 batches", f"({elastic.GLOO_TIMEOUT} s here",
                   "alone 21.0 s after the cut", "the 5 batches done", "one every 10", "7.6 s after the restore",
                   "21.0 s around the cut", "6.5 s when h2 came back", "90 batches ran on h1 alone and 529 on both",
                   "was 91.0%", "here 5."):
        assert number in text
    assert "the 1 batch done" in elastic.note(ELASTIC, "This run", 25, 1, (21.0, 6.5))
    assert "driver_exit" not in text
    stored = {**ELASTIC, "batches_at_size": {"1": 90, "2": 529}}              # results/elastic.json's keys
    assert "90 batches ran on h1 alone and 529 on both" in elastic.note(stored, "In that run", 25, 5, (21.0, 6.5))


def test_the_elastic_note_says_how_horovodrun_exited_when_not_cleanly():
    assert "did not exit, and the kit stopped it" in elastic.note({**ELASTIC, "driver_exit": -9}, "x", 25, 5, (1, 1))
    assert "exited with status 1: a worker" in elastic.driver_note(1)
    assert elastic.driver_note(0) == elastic.driver_note(None) == ""


def test_the_summary_lists_what_the_run_measured():
    lab = ({"allreduce_share": 0.36}, {"allreduce_share": 0.204})
    text = summary.measured(RUN, SEEDS, accuracy.run_checks(RUN, SEEDS), 0.97, {4: 0.98, 16: 0.793},
                            identical=True, resumed=(12, 12), lab=lab)
    for number in ("1. 2 workers reached 86.7% test accuracy, one process 86.4%, after 12 epochs on the same 6,000",
                   "(within or above one process's range over 3 seeds)", "batch ×4 98.0%, ×16 79.3%, against 97.0%",
                   "identical after training: True; resumed from epoch 12 of 12", "36% of a step", "20% over"):
        assert number in text
    assert text.endswith("20% over 10 Gbit/s.")                                   # runs without their speed-ups
    lab_up = ({"allreduce_share": 0.45, "speedup": 1.80}, {"allreduce_share": 0.19, "speedup": 1.86})
    same = summary.measured(RUN, None, [], 0.97, {4: 0.98}, True, (12, 12), lab_up)
    assert "the speed-ups over one worker were 1.80× and 1.86×, within 10% of each other: the link's speed" in same
    lab_up[1]["speedup"] = 2.0
    assert "1.80× and 2.00×: the faster link paid." in summary.measured(RUN, None, [], 0.97, {4: 0.98}, True,
                                                                         (12, 12), lab_up)
    lab_up[1]["speedup"] = 1.5
    assert "1.80× and 1.50×: the faster link's run was the slower one" in summary.measured(
        RUN, None, [], 0.97, {4: 0.98}, True, (12, 12), lab_up)
    below = dict(RUN, acc_n=0.85)
    assert "(below one process's range" in summary.measured(below, SEEDS, accuracy.run_checks(below, SEEDS), 0.97,
                                                             {4: 0.98}, False, (11, 12), lab)
    assert "seeds)" not in summary.measured(RUN, None, [], 0.97, {4: 0.98}, True, (12, 12), lab)


def _lab_run(n, rate, speedup, step_s, allreduce_s, link_s, busy, steps=30):
    return dict(n=n, rate=rate, samples_per_s=1000 * speedup, speedup=speedup, step_s=step_s, allreduce_s=allreduce_s,
                allreduce_share=allreduce_s / step_s, link_s=link_s, cores_busy=[busy] * n, steps=steps, batch=128)


# one worker 1,000 samples/s in 128 ms; on 2 hosts both lab checks hold (1.90x >= 1.1 x 1.50x; 43 ms <= 50 ms)
LAB = {"gradient_bytes": 4_800_000, "cores": 2, "machine": {"date": "2026-12-01T10:00:00"},
       "one_worker": {"n": 1, "samples_per_s": 1000.0, "step_s": 0.128, "allreduce_s": 0.0, "cores_busy": [1.0]},
       "runs": [_lab_run(2, "1gbit", 1.50, 0.1707, 0.050, 0.0384, 0.98),
                _lab_run(2, "10gbit", 1.90, 0.1347, 0.020, 0.00384, 0.99),
                _lab_run(4, "10gbit", 2.10, 0.240, 0.090, 0.0058, 0.49)]}
# the committed benchmark: both fail (1.84x < 1.1 x 1.78x; a step 54 ms over one worker's, its allreduce 45 ms)
BENCH = {**LAB, "one_worker": {**LAB["one_worker"], "step_s": 0.110},
         "runs": [_lab_run(2, "1gbit", 1.78, 0.164, 0.045, 0.0384, 0.71, 80),
                  _lab_run(2, "10gbit", 1.84, 0.120, 0.022, 0.00384, 0.80, 80)]}


def test_the_lab_note_tells_this_runs_exchange_checks_lesson_benchmark_and_four_hosts():
    text = lab.note(LAB, BENCH, "In this run", None)
    for number in ("In this run, one worker alone trained 1,000 samples/s (128 ms per step). On 2 hosts the 4.8 MB",
                   "spent 50 ms per step in the allreduce over 1 Gbit/s links, where the wire alone needs 38 ms",
                   "and 20 ms over 10 Gbit/s, where it needs 3.8 ms", "The lab's checks:\n\n- **1 vs 10 Gbit/s on 2 "
                   "hosts** held: 1.50× one worker", "- **only the exchange slows a step** held: at 1 Gbit/s a step "
                   "took 43 ms more", "The wire alone needs one worker's whole step (128 ms)",
                   "(`python -m kit.bench mnist_lab`, 2026-12-01) ran 2 hosts at 1.78× and 1.84×:",
                   "the allreduce took 45 ms in the benchmark and 50 ms here (about the same)",
                   "With 4 hosts, 4 workers share this machine's 2 cores", "(each worker busy 0.49 of a core): a step "
                   "took 240 ms even at 10 Gbit/s", "stretched with it (90 ms)"):
        assert number in text
    bench = text[text.index("The committed benchmark"):]
    assert "did not hold" not in text[:text.index("The committed benchmark")]
    assert bench.count("**did not hold** on this run") == 2
    assert "because the 1 Gbit/s step took +44 ms against the 10 Gbit/s one although its allreduce took 23 ms longer" \
        in bench
    assert "because a worker kept only 0.71 of a core busy" in bench


def test_the_lab_note_without_a_lab_leaves_out_the_benchmark_and_says_why_its_checks_failed():
    source = "No lab on this machine (not root): in the committed run of `python -m kit.bench mnist_lab`"
    text = lab.note(BENCH, BENCH, source, "not root")
    assert text.startswith(source + ", one worker alone trained 1,000 samples/s (110 ms per step)")
    assert "The committed benchmark" not in text and "With 4 hosts" not in text and lab.crowded_note(BENCH) == ""
    assert text.count("**did not hold** on this run") == 2 and "because a worker kept only 0.71 of a core" in text
    assert "With 4 hosts" in lab.note(LAB, BENCH, source, "not root")


PER_STEP = {"NEGOTIATE_ALLREDUCE": (0.0592, 0.0246), "ALLREDUCE": (0.05, 0.03), "GLOO_ALLREDUCE": (0.031, 0.016)}


def test_the_timeline_note_says_whether_the_allreduces_went_out_together():
    text = step_time.overlap_note(4, 8, False, PER_STEP)
    for number in ("**4 of the 8** gradient tensors", "so the other 4 started earlier, while backward still ran",
                   "(NEGOTIATE) during 24.6 ms", "the Gloo exchange itself ran during 16.0 ms",
                   "the NEGOTIATE bars add up to 59.2 ms"):
        assert number in text
    together = step_time.overlap_note(7, 8, True, PER_STEP)
    assert "**7 of the 8**" in together and "the allreduces go out together at the end" in together
    assert "started earlier" not in together


def test_the_appendix_summary_lists_what_its_run_measured():
    text = step_time.measured(4, 8, False, PER_STEP, 1222.3, 2298.1, 2, 2121.2, identical=True)
    for number in ("1. Per step (median), 4 of 8 gradient allreduces", "the other 4 started earlier, overlapping",
                   "covered 24.6 ms of wall clock, the exchange 16.0 ms.", "1 worker 1,222 samples/s, 2 workers 2,298 "
                   "samples/s (1.88x, efficiency 94%)", "the no-overlap model predicted 2,121.",
                   "3. The PyTorch replicas ended identical: True."):
        assert number in text
    other = step_time.measured(8, 8, True, PER_STEP, 1000.0, 1500.0, 2, 1800.0, identical=False)
    assert "together at the end of the step, barely overlapping backward" in other and "identical: False" in other
    assert "(1.50x, efficiency 75%)" in other
