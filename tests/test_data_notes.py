"""kit.data.notes: notebook 01's sentences about its run, each number of the run in the text, and the CPU
pipeline's checks (the workers' gain, the cores' floor) each made to hold and to fail, a failing one saying why."""
from types import SimpleNamespace

from kit import checks
from kit.data import notes

FIT = dict(t_load=0.0568, t_load_cpu=0.0143, t_compute=0.0300, c_compute=0.0321, t_compute_alone=0.0322,
           t_handover=0.0018, cores=2)


def row(w, sps, busy, step, error, spread=0.03):
    return dict(workers=w, samples_per_s=sps, rounds=[(sps - 6, 0.1), (sps + 9, 0.1)], busy=busy, wait_ms=2.5,
                step_ms=step, predicted_ms=31.8, model_error=error, step_spread=spread)


ROWS = [row(0, 718, 0.36, 89.0, 0.0), row(1, 1107, 0.52, 57.8, 0.02), row(2, 1971, 0.92, 32.4, 0.02),
        row(4, 1871, 0.93, 34.2, 0.07)]


def test_the_fit_line_and_the_table_carry_the_runs_numbers():
    line = notes.fit_line(FIT)
    assert "t_load = 56.8 ms" in line and "t_compute beside workers = 30.0 ms" in line and line.endswith("cores = 2")
    assert "t_compute with loading in the loop (W=0) = 32.2 ms" in line and "t_handover = 1.8 ms" in line
    table = notes.sweep_table(ROWS, (0, 2)).splitlines()
    assert table[0].split() == ["W", "samples/s", "per", "round", "busy", "wait", "ms", "step", "ms", "model", "ms",
                                "error"]
    assert table[2].split() == ["1", "1107", "1101-1116", "52%", "2.5", "57.8", "31.8", "2%"]
    assert table[3].endswith("(fitted)") and not table[4].endswith("(fitted)")


def test_the_model_note_says_which_held_out_w_was_a_real_prediction():
    held_out = [ROWS[1], ROWS[3]]
    text = notes.model_note(held_out, ROWS[3], [1], 0.0318, (0, 2), rounds=3)
    assert "Fitted to the W = 0 and 2 runs" in text and "W = 1, 4 within 7% (worst case)" in text
    assert "beyond the spread of the step time over the rounds (3% at W = 4): more than run-to-run noise" in text
    assert "At W = 1 the loader's side set the pace" in text and "At W = 4 the step's side did" in text
    assert "fitted to at W = 2 (31.8 ms)" in text
    quiet = notes.model_note(held_out, ROWS[1], [], 0.0318, (0, 2), rounds=1)
    assert "within 2% (worst case)." in quiet and "spread" not in quiet
    assert "At no held-out W did the loader's side set the pace" in quiet and "At W = 1, 4 the step's side" in quiet
    noisy = notes.model_note(held_out, row(4, 1871, 0.93, 34.2, 0.02, spread=0.05), [1, 4], 0.0318, (0, 2), 3)
    assert "within the spread of the step time over the rounds (5% at W = 4)." in noisy
    assert "the step's side" not in noisy


def test_the_cpu_note_gives_the_loading_share_the_cap_and_each_ws_error():
    kr = [dict(workers=w, model_error=e) for w, e in ((0, 0.0), (1, 0.05), (4, 0.12))]
    text = notes.cpu_note(dict(t_load=0.2, t_compute_alone=0.08), kr, 1.42, 63.4)
    assert "loading 71% of its step at W = 0" in text and "feed 1.4 workers (W_eff = min(W, 1.4))" in text
    assert "= 63 ms" in text and "W=0: 0%, W=1: 5%, W=4: 12%" in text


def test_the_cpu_pipelines_checks_hold_on_a_quiet_machine():
    gained, floor = notes.cpu_checks(2.2, dict(workers=2, step_ms=66.0), 63.4, 2, 0.0)
    assert gained.held and floor.held
    text = checks.markdown([gained, floor])
    assert "did not hold" not in text and "2.2x its samples/s" in text and "at least 1.2x" in text
    assert "66 ms, at W = 2, +4% from that floor" in text and "no faster than 63 ms, less 5%" in text
    assert "kept 0% of the 2 cores busy" in text


def test_the_cpu_pipelines_checks_fail_with_their_reasons():
    gained, floor = notes.cpu_checks(1.05, dict(workers=4, step_ms=57.0), 63.4, 2, 0.85)
    assert not gained.held and not floor.held
    text = checks.markdown([gained, floor])
    assert text.count("**did not hold**") == 2 and "1.05x its samples/s at W = 0 at best" in text
    assert "because the decoders found no free core (other processes kept 85% of the 2 cores busy" in text
    assert "-10% from that floor" in text and "because the step was 10% faster than the CPU-seconds" in text
    assert "Re-run on a quiet machine" in text
    assert notes.cpu_checks(2.2, dict(workers=4, step_ms=61.0), 63.4, 2, 0.0)[1].held     # -4%: within the noise


def test_a_step_under_the_floor_is_explained_by_the_cpu_the_run_measured():
    fastest = dict(workers=4, step_ms=57.0, cpu_ms=50.0, workers_cpu_ms=60.0)       # 110 ms of CPU against 126.8
    text = checks.markdown([notes.cpu_checks(2.2, fastest, 63.4, 2, 0.0)[1]])
    assert ("because at W = 4 the training process used 50 ms of CPU per step and its workers 60 ms, 110 ms in "
            "all, against the 127 ms the W = 0 run measured") in text and "cost 13% less CPU this way" in text
    clocks = dict(fastest, workers_cpu_ms=90.0)                                         # 140 ms: impossible on 2 cores
    text = checks.markdown([notes.cpu_checks(2.2, clocks, 63.4, 2, 0.0)[1]])
    assert "used 140 ms of CPU per step, no less than the W = 0 run's 127 ms" in text and "disagree" in text


def test_the_summary_lists_the_runs_numbers_and_the_traces_verdict():
    prof = SimpleNamespace(recommended_workers=2, step_predicted=0.038)
    text = notes.summary(ROWS, ROWS[2], 2.74, 0.07, (0, 2), True, prof, {"step": 0.033})
    assert "Busy at num_workers=0: 36%; the most samples/s at num_workers=2: 2.7x of num_workers=0, busy 92%" in text
    assert "fitted to W = 0 and 2, predicted the other worker counts within 7%" in text
    assert "sweep's: held." in text
    assert "recommended num_workers=2: predicted 38 ms/step, measured 33 ms/step (-13%)" in text
    assert "sweep's: did not hold." in notes.summary(ROWS, ROWS[2], 2.74, 0.07, (0, 2), False, prof, {"step": 0.033})


# --- appendix 01a: tf.data's buffers on the serial map ----------------------------------------------------------
def _tf_row(name, sps, wait, compute=38.0):
    return {"workers": name, "samples_per_s": sps, "wait_ms": wait, "compute_ms": compute}


def test_the_prefetch_note_says_the_baseline_was_already_overlapped_and_the_loader_set_the_pace():
    serial, pre, four = _tf_row("map", 808, 41.3), _tf_row("map + prefetch", 765, 45.7), _tf_row("p4", 791, 42.4)
    ahead = {"load_ms": 78.0, "after_away_ms": 39.0, "away_ms": 38.0}
    text = notes.prefetch_note(serial, pre, four, ahead, dict(ahead, after_away_ms=40.0), 64)
    for s in ("from 41.3 to 45.7 ms (a buffer of 4 batches: 42.4 ms), the throughput -5%", "L = 78 ms", "C = 38 ms",
              "waited 39 ms without prefetch and 40 ms with it", "the baseline was already overlapped",
              "one batch per 78 ms at best"):
        assert s in text, (s, text)
    check = notes.prefetch_check(serial, [pre, four], ahead, 64)
    assert check.held and "1000 samples/s" not in check.bound and "821 samples/s" in check.bound   # 64 / 78 ms
    fast = notes.prefetch_check(serial, [pre, _tf_row("p4", 1400, 5.0)], ahead, 64)     # beat the loader's pace
    text = checks.markdown([fast])
    assert "did not hold" in text and "it beat the pace of the loader timed alone" in text
    kept_up = notes.prefetch_note(serial, pre, four, dict(ahead, load_ms=30.0, after_away_ms=29.0), ahead, 64)
    assert "nothing was loaded while the consumer was away" in kept_up and "kept up with the step" in kept_up


def test_the_parallel_note_compares_map8_with_autotune_beyond_the_noise():
    serial, auto = _tf_row("map", 808, 41.3), _tf_row("auto", 1298, 10.8)
    assert "went further" in notes.parallel_note(auto, _tf_row("8", 1454, 3.8), serial)            # +12%
    assert "no evidence" in notes.parallel_note(auto, _tf_row("8", 1330, 3.8), serial)             # +2%
    assert "AUTOTUNE did better" in notes.parallel_note(auto, _tf_row("8", 1100, 3.8), serial)
    assert "did not cut the wait" in notes.parallel_note(_tf_row("auto", 900, 40.0), auto, serial)


def test_run_ahead_times_a_pipeline_alone_and_after_the_consumer_was_away():
    import time

    import numpy as np

    from kit.data import tfdata

    class Loader:                         # 30 ms a batch, loaded ahead while the consumer is away
        def as_numpy_iterator(self):
            ready = time.perf_counter() + 0.03
            while True:
                time.sleep(max(0.0, ready - time.perf_counter()))
                ready = max(ready, time.perf_counter()) + 0.03
                yield np.zeros((2, 1)), np.zeros(2, np.int64)
    got = tfdata.run_ahead(Loader(), away_s=0.05, steps=3)
    assert 25 <= got["load_ms"] <= 45 and got["after_away_ms"] < 10 and got["away_ms"] == 50.0, got


# --- appendix 01a: persistent workers and the summary -------------------------------------------------------------
def test_the_persistent_note_gives_the_saving_and_calls_it_little_below_two_percent_of_an_epoch():
    later = {False: 0.1014, True: 0.0668}
    text = notes.persistent_note(later, later[False] - later[True], 70, 2.6)
    for s in ("waited 67 ms with persistent workers against 101 ms with new ones", "35 ms (34% of that wait)",
              "(70 steps, about 2.6 s) that is 1.3% of the epoch: little here"):
        assert s in text, (s, text)
    assert "worth having" not in text
    short = notes.persistent_note(later, later[False] - later[True], 10, 0.5)       # 6.9% of a 0.5 s epoch
    assert "(10 steps, about 0.5 s) that is 6.9% of the epoch: worth having even here" in short
    assert "little here" not in short


def test_the_knobs_summary_lists_each_knobs_samples_per_s():
    pf = {"prefetch_factor=1": 1686.2, "prefetch_factor=2": 1734.4, "prefetch_factor=4": 1853.9}
    text = notes.knobs_summary(pf, 2, {"workers": "2 processes", "samples_per_s": 1232.0},
                               {"workers": "1 (in the loop)", "samples_per_s": 561.8},
                               {"workers": "map(8) + prefetch", "samples_per_s": 1284.3},
                               {"workers": "map, no prefetch", "samples_per_s": 732.0})
    lines = text.splitlines()
    assert lines[0] == "1. `prefetch_factor` 1, 2, 4 with 2 workers: 1686, 1734, 1854 samples/s."
    assert lines[1] == "2. Keras `PyDataset`: best 1232 samples/s with 2 processes, against 562 loading in the loop."
    assert lines[2] == ("3. tf.data: best 1284 samples/s with map(8) + prefetch, against 732 without parallel map "
                        "or prefetch.")


def test_the_prefetch_factor_note_weighs_the_spread_against_the_noise():
    run = {"prefetch_factor=1": {"samples_per_s": 1788.0, "busy": 0.92},
           "prefetch_factor=2": {"samples_per_s": 1831.0, "busy": 0.93},
           "prefetch_factor=4": {"samples_per_s": 1713.0, "busy": 0.94}}
    text = notes.prefetch_factor_note(run)
    assert ("From the slowest setting (prefetch_factor=4, 1713 samples/s) to the fastest (prefetch_factor=2, 1831) "
            "the throughput differs by 7%; the step was busy 92% to 94% of the time. Within 10%, one run each") in text
    run["prefetch_factor=4"]["samples_per_s"] = 1500.0
    wide = notes.prefetch_factor_note(run)
    assert "differs by 22%" in wide and "More than 10%, but one run each on a shared machine" in wide


def test_the_prefetch_factor_note_says_loading_kept_up_only_when_the_step_was_busy():
    run = {"prefetch_factor=1": {"samples_per_s": 1000.0, "busy": 0.70},
           "prefetch_factor=4": {"samples_per_s": 1050.0, "busy": 0.72}}
    text = notes.prefetch_factor_note(run)
    assert "no evidence that the queue's depth matters here." in text and "kept up" not in text
    run["prefetch_factor=1"]["busy"] = run["prefetch_factor=4"]["busy"] = 0.93
    assert "loading kept up on average" in notes.prefetch_factor_note(run)
