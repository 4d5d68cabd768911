"""Notebook 01's kit: the image pipeline (kit.data), the utilization monitor and the loader profiler (kit.data.monitor).

Correctness only: the monitor's busy fraction on loops of known wait/compute durations, the step-time model,
the profiler's recommendation, and the error paths (bad num_workers, a failing sample inside a worker).
Nothing here depends on how fast this machine is: timings are injected (a fake clock, recorded steps), and
real sleeps are only checked from below (a sleep never ends early).
"""
import json
import threading
import time
import warnings

import numpy as np
import pytest
import torch

from kit import data
from kit.data import tfdata as data_tf, monitor, profiler


@pytest.fixture(scope="module")
def store():
    return data.make_store(192, size=28, fmt="png")


def timed_batches(n, wait_s, size=4):
    """Yield n batches, each after sleeping wait_s (a loader whose next() takes a known time)."""
    for _ in range(n):
        time.sleep(wait_s)
        yield torch.zeros(size, 1), torch.zeros(size)


class FakeClock:
    """A clock that moves only when told: wall and CPU seconds for a Monitor (no sleeping, no machine speed)."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def advance(self, wall, cpu=0.0):
        self.wall += wall
        self.cpu += cpu


def fake_loop(mon, clock, steps, wait_s, compute_s, wait_cpu=0.0, compute_cpu=0.0, size=4):
    """Run mon.watch over a loader whose next() takes wait_s and a step that takes compute_s, on the fake clock."""
    def loader():
        for _ in range(steps):
            clock.advance(wait_s, wait_cpu)
            yield torch.zeros(size, 1), torch.zeros(size)
    for _ in mon.watch(loader(), steps=steps):
        clock.advance(compute_s, compute_cpu)


# --- the pipeline --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size,fmt", [(28, "png"), (64, "jpeg")])
def test_samples_are_decoded_augmented_and_normalised(size, fmt):
    st = data.make_store(8, size=size, fmt=fmt)
    assert st.images[0][:4] == (b"\x89PNG" if fmt == "png" else b"\xff\xd8\xff\xe0")
    x, y = data.load_sample(st, 3, seed=1)
    assert x.shape == (1, 28, 28) and x.dtype == np.float32
    assert -1.0 <= x.min() < x.max() <= 1.0
    assert y == int(st.labels[3])
    again, _ = data.load_sample(st, 3, seed=1)
    other, _ = data.load_sample(st, 3, seed=2)
    assert np.array_equal(x, again) and not np.array_equal(x, other)   # augmentation depends on (seed, i) only


def test_io_latency_costs_wall_time_not_cpu(store):
    wall, cpu = time.perf_counter(), time.process_time()
    data.read(store, 0, io_ms=50)
    assert time.perf_counter() - wall >= 0.05
    assert time.process_time() - cpu < 0.02


@pytest.mark.engines        # loader workers or a busy subprocess: processes
def test_workers_return_the_same_batches_as_the_main_process(store, no_leaks):
    ds = data.ImageDataset(store)
    serial = [b for b in data.make_loader(ds, 32, num_workers=0, seed=3)]
    parallel = [b for b in data.make_loader(ds, 32, num_workers=2, seed=3)]
    assert len(serial) == len(parallel) == len(store) // 32
    for (xa, ya), (xb, yb) in zip(serial, parallel):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_keras_pydataset_and_tf_data_yield_the_pipeline(store):
    kd = data_tf.keras_dataset(store, batch_size=16, workers=2, use_multiprocessing=False, max_queue_size=4)
    assert (kd.workers, kd.use_multiprocessing, kd.max_queue_size) == (2, False, 4)
    x, y = kd[0]
    assert x.shape == (16, 1, 28, 28) and y.shape == (16,)
    assert np.array_equal(x[0], data.load_sample(store, int(kd.order[0]))[0])
    tx, ty = next(iter(data_tf.tf_dataset(store, batch_size=16, parallel="autotune").as_numpy_iterator()))
    assert tx.shape == (16, 1, 28, 28) and tx.dtype == np.float32 and ty.shape == (16,)
    bx, _ = next(iter(data_tf.tf_dataset(store, batch_size=16, prefetch=4).as_numpy_iterator()))   # a set buffer
    assert np.array_equal(bx, next(iter(data_tf.tf_dataset(store, batch_size=16, prefetch=False)))[0].numpy())
    with pytest.raises(ValueError, match="prefetch must be True .AUTOTUNE., False or a buffer of n >= 1"):
        data_tf.tf_dataset(store, prefetch=0)


# --- the monitor ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("wait_s,compute_s", [(0.03, 0.01), (0.01, 0.03)])
def test_busy_fraction_of_a_loop_on_an_injected_clock(wait_s, compute_s):
    clock = FakeClock()
    with monitor.Monitor(warmup=2, nvml=False, clock=lambda: clock.wall, cpu_clock=lambda: clock.cpu) as mon:
        fake_loop(mon, clock, 14, wait_s, compute_s, wait_cpu=0.002, compute_cpu=compute_s)
    st = mon.stats()
    assert st["steps"] == 12
    assert st["busy"] == pytest.approx(compute_s / (wait_s + compute_s))
    assert st["wait"] == pytest.approx(wait_s) and st["compute"] == pytest.approx(compute_s)
    assert st["wait_cpu"] == pytest.approx(0.002) and st["compute_cpu"] == pytest.approx(compute_s)
    assert st["samples_per_s"] == pytest.approx(4 / (wait_s + compute_s))


def test_the_workers_cpu_is_read_over_the_steady_steps_and_merged_per_step(monkeypatch):
    used = iter([1.5, 2.7, 10.0, 10.9])                   # CPU s of the children: start and end of each run's steadies
    monkeypatch.setattr(monitor, "children_cpu", lambda: next(used))
    clock, runs = FakeClock(), []
    for _ in range(2):
        with monitor.Monitor(warmup=2, nvml=False, clock=lambda: clock.wall, cpu_clock=lambda: clock.cpu) as mon:
            fake_loop(mon, clock, 8, 0.03, 0.01)
        runs.append(mon)
    assert runs[0].tree_cpu == (pytest.approx(1.2), 6) and runs[0].stats()["workers_cpu"] == pytest.approx(0.2)
    assert monitor.merge(runs).stats()["workers_cpu"] == pytest.approx((1.2 + 0.9) / 12)
    recorded = monitor.Monitor(warmup=0, nvml=False)
    recorded.record(wait_s=0.02, compute_s=0.06)
    assert "workers_cpu" not in recorded.stats()                # steps recorded, not watched: nothing measured


def test_real_sleeps_are_timed_from_below():
    with monitor.Monitor(warmup=0, nvml=False) as mon:
        for _ in mon.watch(timed_batches(4, 0.02), steps=4):
            time.sleep(0.01)
    assert len(mon.steps) == 4
    assert all(s.wait >= 0.02 and s.compute >= 0.01 for s in mon.steps)   # a sleep never ends early
    assert all(a.end <= b.start for a, b in zip(mon.steps, mon.steps[1:]))


def test_recorded_steps_and_utilization_trace():
    mon = monitor.Monitor(warmup=0, nvml=False)
    for _ in range(10):
        mon.record(wait_s=0.02, compute_s=0.06, samples=8)
    st = mon.stats()
    assert st["busy"] == pytest.approx(0.75) and st["samples_per_s"] == pytest.approx(100)
    t, util = mon.utilization(window=0.08)
    assert len(t) == 10 and np.allclose(util, 75)
    with pytest.raises(ValueError, match="no steps recorded"):
        monitor.Monitor(nvml=False).stats()
    other = monitor.Monitor(warmup=1, nvml=False)
    for _ in range(5):
        other.record(wait_s=0.06, compute_s=0.02, samples=8)
    both = monitor.merge([mon, other])                        # 10 + 4 steady steps laid end to end
    assert both.stats()["steps"] == 14 and both.runs == [mon, other]
    assert both.stats()["busy"] == pytest.approx((10 * 0.06 + 4 * 0.02) / (14 * 0.08))


def test_merged_runs_keep_their_nvml_samples():
    """kit.bench gpu reports NVML's utilisation of a sweep's merged runs (the lent GPU run read n/a without this)."""
    runs = []
    for util in (10.0, 30.0):
        mon = monitor.Monitor(warmup=0, nvml=False)
        mon.record(wait_s=0.01, compute_s=0.01)
        mon.samples = [(0.0, util, 1.0), (0.05, util, 2.0)]          # as the NVML thread records them
        runs.append(mon)
    both = monitor.merge(runs)
    assert [u for _, u, _ in both.samples] == [10.0, 10.0, 30.0, 30.0]
    assert [t for t, _, _ in both.samples] == sorted(t for t, _, _ in both.samples)
    assert both.stats()["gpu_util"] == pytest.approx(20.0) and both.stats()["gpu_mem_gib"] == 2.0


def test_nvml_utilisation_is_read_over_the_steady_steps_after_nvml_s_averaging_window():
    """The lent H200's first sized sweep read 54% at W=16 although the step was busy 99% of a 0.4 s run: the mean
    took in the workers' start and readings still averaging it. Now: samples in the steady steps, after NVML_LAG."""
    mon = monitor.Monitor(warmup=2, nvml=False)
    for _ in range(2):
        mon.record(wait_s=0.5, compute_s=0.0)                     # warm-up: workers start, the GPU idles
    for _ in range(30):
        mon.record(wait_s=0.0, compute_s=0.1)                     # 3 s of steady steps from t = 1 s
    mon.samples = [(0.05 * i, 0.0 if 0.05 * i < 1.0 + monitor.NVML_LAG else 95.0, 1.0) for i in range(81)]
    steady = mon.steady_samples()
    assert [t for t, _, _ in steady] == [t for t, _, _ in mon.samples if 2.0 <= t <= 4.0]
    assert mon.stats()["gpu_util"] == 95.0 and mon.stats()["gpu_util_samples"] == len(steady) == 41
    short = monitor.Monitor(warmup=1, nvml=False)                 # shorter than NVML_LAG: what lies inside it
    for compute in (0.3, 0.2, 0.2):
        short.record(wait_s=0.0, compute_s=compute)
    short.samples = [(0.1, 10.0, 1.0), (0.4, 50.0, 1.0), (0.6, 70.0, 1.0)]
    assert short.stats()["gpu_util"] == 60.0 and short.stats()["gpu_util_samples"] == 2
    both = monitor.merge([mon, short])                            # each run's own steady readings
    assert both.stats()["gpu_util_samples"] == 43
    assert both.stats()["gpu_util"] == pytest.approx((41 * 95.0 + 50.0 + 70.0) / 43)


def test_a_gpu_measures_seconds_of_the_sized_step_for_nvml():
    from kit.data import lesson
    assert lesson.steps_for_nvml(0.016, 30) == 125                # 2 s of 16 ms steps
    assert lesson.steps_for_nvml(0.5, 30) == 30                   # a slow step: the steps asked for are enough
    with pytest.raises(ValueError, match="t_step must be a positive time"):
        lesson.steps_for_nvml(0.0, 30)


@pytest.mark.parametrize("gpu", [True, False])
def test_without_nvml_the_monitor_says_so_once_on_a_gpu_and_keeps_no_thread(monkeypatch, gpu):
    monkeypatch.setattr(monitor, "open_nvml", lambda index=0: None)
    monkeypatch.setattr(monitor, "cuda_present", lambda: gpu)
    monitor.say_no_nvml.cache_clear()                           # as in a fresh process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            with monitor.Monitor() as mon:
                for _ in mon.watch(timed_batches(5, 0.001)):
                    pass
    if gpu:                                                     # a GPU whose NVML cannot be read: said once
        assert [w.category for w in caught] == [monitor.NoNVMLWarning]
        assert "CPU-side" in str(caught[0].message)
    else:                                                       # a CPU-only machine: nothing to warn about
        assert [w for w in caught if w.category is monitor.NoNVMLWarning] == []
    assert not mon.has_nvml and mon.samples == [] and mon.stats()["steps"] == 2


def test_nvml_thread_samples_and_never_outlives_the_block(monkeypatch):
    monkeypatch.setattr(monitor, "open_nvml", lambda index=0: lambda: (42.0, 1.5))
    before = set(threading.enumerate())
    with pytest.raises(RuntimeError, match="boom"):
        with monitor.Monitor(sample_s=0.005) as mon:
            assert mon._thread.is_alive()
            deadline = time.monotonic() + 60                  # however busy the machine: wait for 3 samples
            while len(mon.samples) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            raise RuntimeError("boom")
    assert set(threading.enumerate()) == before
    assert len(mon.samples) >= 3 and mon.samples[0][1:] == (42.0, 1.5)


# --- the model and the profiler ------------------------------------------------------------------------------
def test_model_io_parallelises_past_cores_cpu_does_not():
    io_bound = dict(t_load=0.09, t_compute=0.03, t_load_cpu=0.0, c_compute=0.03, cores=2)
    cpu_bound = dict(t_load=0.09, t_compute=0.03, t_load_cpu=0.09, c_compute=0.03, cores=2)
    assert monitor.predict_step(0, **io_bound) == pytest.approx(0.12)
    assert monitor.predict_step(1, **io_bound) == pytest.approx(0.09)
    assert monitor.predict_step(3, **io_bound) == pytest.approx(0.03)          # 3 sleeping workers, 2 cores
    assert monitor.predict_step(8, **cpu_bound) == pytest.approx(0.06)          # (0.09 + 0.03) / 2 cores
    assert monitor.predict_busy(8, 0.09, 0.03, t_load_cpu=0.09, c_compute=0.03, cores=2) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="workers must be >= 0"):
        monitor.predict_step(-1, 0.1, 0.1)


def test_recommendation_is_the_fewest_workers_that_reach_the_best_step():
    assert profiler.recommend_workers(0.09, 0.03, 0.0, 0.03, cores=2) == 3
    assert profiler.recommend_workers(0.01, 0.03, 0.01, 0.03, cores=2) == 1
    assert profiler.recommend_workers(0.09, 0.03, 0.09, 0.03, cores=2) == 2    # CPU-bound: W_eff caps at 1.33


def test_profile_of_a_recorded_io_bound_run():
    mon = monitor.Monitor(warmup=3, nvml=False)
    for _ in range(30):                                       # loads wait 30 ms on I/O, steps compute 10 ms
        mon.record(wait_s=0.03, compute_s=0.01, samples=64, wait_cpu=0.0, compute_cpu=0.01)
    prof = profiler.profile(mon, workers=0, cores=2)
    assert prof.workers == 0 and prof.stall == pytest.approx(0.75)
    assert prof.t_load == pytest.approx(0.03) and prof.t_load_cpu == 0.0 and prof.t_compute == pytest.approx(0.01)
    assert prof.recommended_workers == 3                      # 3 sleeping reads overlap one 10 ms step
    assert prof.speedup == pytest.approx(4)                   # 40 ms per step -> 10 ms
    assert not prof.cpu_bound and "recommended num_workers  3" in str(prof)


def test_profile_of_a_recorded_cpu_bound_run_says_more_workers_cannot_help():
    mon = monitor.Monitor(warmup=0, nvml=False)
    for _ in range(10):                                       # decoding burns 90 ms of CPU, the step 30 ms
        mon.record(wait_s=0.09, compute_s=0.03, wait_cpu=0.09, compute_cpu=0.03)
    prof = profiler.profile(mon, workers=0, cores=2)
    assert prof.recommended_workers == 2 and prof.step_predicted == pytest.approx(0.06)   # (90 + 30) ms / 2 cores
    assert prof.cpu_bound and "CPU-bound                True" in str(prof)


@pytest.mark.engines        # loader workers or a busy subprocess: processes
def test_profile_loader_times_a_worker_loader_serially(store, no_leaks):
    loader = data.make_loader(data.ImageDataset(store, io_ms=1.0), 16, num_workers=2)
    prof = profiler.profile_loader(loader, lambda b: time.sleep(0.005), steps=8, cores=2)
    assert prof.workers == 2
    assert prof.t_load >= 0.016                               # 16 reads of 1 ms, timed in this process
    assert prof.recommended_workers == profiler.recommend_workers(prof.t_load, prof.t_compute, prof.t_load_cpu,
                                                                  prof.c_compute, cores=2)


# --- bad input ---------------------------------------------------------------------------------------------
class Broken(torch.utils.data.Dataset):
    """Sample 17 is corrupt."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 17:
            raise ValueError("corrupt PNG header")
        return torch.zeros(1), i


@pytest.mark.parametrize("bad", [-1, 1.5, "2"])
def test_bad_num_workers_is_a_clear_error(store, bad):
    with pytest.raises(ValueError, match="num_workers must be an integer >= 0"):
        data.make_loader(data.ImageDataset(store), num_workers=bad)
    with pytest.raises(ValueError, match="Keras workers must be an integer >= 1"):
        data_tf.keras_dataset(store, workers=-1)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.engines)])
def test_failing_sample_names_index_and_cause_and_stops_workers(workers, no_leaks):
    loader = data.make_loader(Broken(), batch_size=8, num_workers=workers, shuffle=False)
    t0 = time.perf_counter()
    with pytest.raises(data.SampleError) as err:
        for _ in loader:
            pass
    first = str(err.value).splitlines()[0]
    assert first.startswith("sample 17 failed to load: ValueError: corrupt PNG header")
    assert ("worker" in first) == (workers > 0)
    assert time.perf_counter() - t0 < 30
    del err


@pytest.mark.engines        # loader workers or a busy subprocess: processes
def test_failing_sample_inside_the_monitor_stops_workers(no_leaks):
    loader = data.make_loader(Broken(), batch_size=8, num_workers=2, shuffle=False)
    with pytest.raises(data.SampleError, match="sample 17"):
        with monitor.Monitor(nvml=False) as mon:
            for _ in mon.watch(loader):
                pass
    assert len(mon.steps) == 2                                  # batches 0 and 1 arrived, batch 2 holds sample 17


# --- one experiment, two callers ---------------------------------------------------------------------------
def test_sweep_experiment_needs_the_w0_run():
    with pytest.raises(ValueError, match="workers must include 0"):
        data.sweep_experiment(None, None, workers=(1, 2))


@pytest.mark.parametrize("fit_workers", [(1, 2), (0, 3), (0, 0), (0, 1, 2)])
def test_sweep_experiment_fits_to_w0_and_one_run_of_the_sweep(fit_workers):
    with pytest.raises(ValueError, match=r"fit_workers must be \(0, W\)"):
        data.sweep_experiment(None, None, workers=(0, 1, 2), fit_workers=fit_workers)


def test_the_table_gives_each_rounds_throughput_and_the_step_times_spread():
    def run(step_s, steps=6):
        m = monitor.Monitor(nvml=False)
        for _ in range(steps):
            m.record(0.0, step_s, samples=10)
        return m
    mons = {0: monitor.merge([run(0.1), run(0.1), run(0.1)]), 2: monitor.merge([run(0.04), run(0.05), run(0.06)])}
    rows = {r["workers"]: r for r in data.table(mons)}
    assert [ms for _, ms in rows[2]["rounds"]] == pytest.approx([40, 50, 60], rel=1e-6)
    assert [s for s, _ in rows[2]["rounds"]] == pytest.approx([250, 200, 166.7], rel=1e-3)
    assert rows[2]["step_spread"] == pytest.approx(0.02 / 0.05, abs=1e-3) and rows[0]["step_spread"] == 0
    one = data.table({0: run(0.1)})[0]                          # a single run: one round, no spread
    assert one["rounds"] == [[one["samples_per_s"], one["step_ms"]]] and one["step_spread"] == 0


def _swept(per_w: dict) -> dict:
    """sweep_experiment's result for recorded runs: {W: [(wait_s, compute_s) of each round]}, 6 steps of 10."""
    def run(wait_s, compute_s):
        m = monitor.Monitor(nvml=False)
        for _ in range(6):
            m.record(wait_s, compute_s, samples=10)
        return m
    rows = data.table({w: monitor.merge([run(*r) for r in rounds]) for w, rounds in per_w.items()})
    best = max(rows, key=lambda r: r["samples_per_s"])
    return {"rows": rows, "best": best, "at_0": rows[0], "speedup": best["samples_per_s"] / rows[0]["samples_per_s"]}


class _Load:
    def __init__(self, others, cores=2):
        self.others, self.cores = others, cores


def test_the_lesson_holds_by_throughput_and_reports_the_machine():
    from kit.data import lesson
    res = _swept({0: [(0.06, 0.03)] * 3, 2: [(0.002, 0.032)] * 3})     # 90 ms -> 34 ms per step
    gain, slowed, others = lesson.sweep_checks(res, 0.030, _Load(0.02))
    assert gain.held and gain.measured == pytest.approx(2.65, abs=0.01) and gain.bound == f"≥ {lesson.SPEEDUP}"
    assert slowed.held and slowed.measured == pytest.approx(32.0 / 30.0, abs=0.01) and others.held
    assert len(lesson.sweep_checks(res, 0.030)) == 2                     # no MachineLoad given: no row for it


def test_a_busy_machine_that_breaks_the_lesson_fails_each_of_its_rows():
    """The forced failing case of notebook 01: another process holds the cores, the step computes 2.4x its
    calibrated time beside the workers, and the workers lose throughput: every row says no."""
    from kit.data import lesson
    res = _swept({0: [(0.03, 0.035)] * 3, 1: [(0.02, 0.06), (0.02, 0.065), (0.02, 0.07)], 2: [(0.01, 0.072)] * 3})
    gain, slowed, others = lesson.sweep_checks(res, 0.030, _Load(0.55))
    assert not gain.held and not slowed.held and not others.held
    assert gain.name == "samples/s, W=0 over W=0" and slowed.measured == pytest.approx(2.4)
    gain = lesson.sweep_checks(_swept({0: [(0.05, 0.03)], 2: [(0.04, 0.031)]}), 0.03)[0]   # 1.13x: under 1.2x
    assert not gain.held and gain.measured == pytest.approx(1.13, abs=0.01)


def test_the_calibration_is_the_fastest_step_on_a_batch_in_memory(store, monkeypatch):
    from types import SimpleNamespace
    from kit.data import lesson
    clock = FakeClock()                               # the steps take known times, however busy the machine
    monkeypatch.setattr(lesson, "time", SimpleNamespace(perf_counter=lambda: clock.wall))
    times = iter([0.005, 0.012, 0.010, 0.011])        # the first, a warm-up, does not count
    seen = []
    step = lambda batch: (seen.append(batch[0].shape), clock.advance(next(times)))   # noqa: E731
    alone = lesson.calibrate(step, data.ImageDataset(store), 8, reps=3)
    assert alone == pytest.approx(0.010) and seen == [torch.Size([8, 1, 28, 28])] * 4


def test_a_gpu_gets_the_narrowest_model_whose_step_is_half_a_batchs_loading():
    from kit.data import lesson
    timed = []

    def gpu_step(width):                         # an injected GPU: 2 ms at width 1, then width² (FLOPs)
        timed.append(width)
        return 0.002 * width ** 2
    assert lesson.size_step(gpu_step, t_load=0.060) == (4, 0.032) and timed == [1, 2, 3, 4]   # >= 24 ms
    assert lesson.size_step(gpu_step, t_load=0.002) == (1, 0.002)        # a slow step needs no widening
    assert lesson.size_step(gpu_step, t_load=100.0, widths=(1, 2)) == (2, 0.008)   # none enough: the widest
    jump = {1: 0.002, 2: 0.020, 3: 0.200}.get                            # 20 ms is under 40% of 60 ms, 200 ms
    assert lesson.size_step(jump, t_load=0.060, widths=(1, 2, 3)) == (2, 0.020)   # overshoots: keep the narrower
    assert lesson.size_step(jump, t_load=0.150, widths=(1, 2, 3)) == (3, 0.200)   # 20 ms < 30: too short to keep
    with pytest.raises(ValueError, match="t_load must be a positive time"):
        lesson.size_step(gpu_step, t_load=0)
    assert lesson.worker_counts(2) == (0, 1, 2, 4) and lesson.worker_counts(16) == (0, 1, 2, 4, 8, 16)
    assert lesson.worker_counts(12) == (0, 1, 2, 4, 8, 12)


def test_the_cnn_widens_and_width_1_is_the_default_model(store):
    x = torch.zeros(2, 1, 28, 28)
    one, wide = data.make_model(), data.make_model(4)
    assert [tuple(p.shape) for p in one.parameters()] == [tuple(p.shape) for p in data.make_model(1).parameters()]
    assert one(x).shape == wide(x).shape == (2, 10)
    assert [m.out_channels for m in wide if isinstance(m, torch.nn.Conv2d)] == [128, 256]
    from kit.data import lesson
    assert 0 < lesson.load_time(data.ImageDataset(store), 8) < 10         # a batch of 8, loaded in the loop
    width, t_step, t_load = lesson.size_model(data.ImageDataset(store), 8)  # on this CPU, each width timed
    assert width in lesson.WIDTHS and t_step > 0 and t_load > 0


@pytest.mark.engines        # loader workers or a busy subprocess: processes
def test_machine_load_counts_a_busy_process_that_is_not_ours():
    import subprocess
    import sys
    from kit.data import lesson
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        with lesson.MachineLoad() as load:
            time.sleep(1.0)
    finally:
        spin.kill()
        spin.wait()
    assert load.seconds >= 1.0 and load.cores >= 1
    assert 0.8 / load.cores <= load.others <= 1.0          # one spinning core of `cores`, and whatever else ran


@pytest.mark.engines        # a benchmark run, with loader workers
@pytest.mark.timeout(600)
def test_bench_loading_smoke_run_at_a_tiny_size(tmp_path, no_leaks):
    from kit import bench
    summary = bench.run("loading", tmp_path, quick=True)
    doc = json.loads((tmp_path / "loading.json").read_text())
    assert summary.startswith("loading: busy") and doc["summary"] == summary
    assert [r["workers"] for r in doc["sweep"]] == [0, 1, 2]
    assert all(r["samples_per_s"] > 0 and 0 < r["busy"] <= 1 for r in doc["sweep"])
    assert doc["fit"]["t_load"] > 0 and doc["best_workers"] in (0, 1, 2)
    # fitted to W = 0 and 2: the error that is reported is the one on W = 1, which the fit did not see
    assert doc["fit_workers"] == [0, 2] and doc["held_out_error"] == doc["sweep"][1]["model_error"]
    assert (tmp_path / "loading.png").stat().st_size > 0 and (tmp_path / "loading_timeline.png").stat().st_size > 0
    from kit import trace                                    # the W = 0 and best-W runs as Chrome traces
    assert doc["traces"]["files"] == sorted({"loading_W0.json.gz", f"loading_W{doc['best_workers']}.json.gz"},
                                            key=lambda f: int(f[9:-8]))
    for name in doc["traces"]["files"]:
        tr = trace.load(tmp_path / name)
        assert trace.invalid_events(tr) == [] and trace.data_wait(tr)["steps"] == doc["traces"]["active_steps"]
    names = [c["name"] for c in doc["traces"]["checks"]]
    assert names[0] == "W=0: trace's data-wait share" and len(names) == len(doc["traces"]["files"])
    assert doc["traces"]["held"] == all(c["held"] for c in doc["traces"]["checks"])
    assert "checks: " in doc["summary"] and all(n in doc["summary"] for n in names)


def test_benchmarks_leave_the_matplotlib_backend_alone():
    import inspect
    from kit.bench import loading, mnist
    for fn in (loading.bench, mnist.bench):
        assert "matplotlib.use" not in inspect.getsource(fn) and "pyplot" not in inspect.getsource(fn)


class _QueuedLoader(list):
    """A list of batches that says it has loader workers (no process starts): what `measure` reads of a loader."""
    num_workers, prefetch_factor = 2, 3


def test_measure_skips_the_batches_the_workers_queued_before_counting():
    """Workers fill num_workers x prefetch_factor batches while starting; counted, a short run beats the loader's
    own pace (notebook 01's CPU pipeline once beat its core-limited floor by 13% that way)."""
    assert data.queued(data.make_loader(data.ImageDataset(data.make_store(8)), 4, num_workers=0)) == 0
    assert data.queued(data.make_loader(data.ImageDataset(data.make_store(8)), 4, num_workers=3)) == 6   # default 2
    batches = _QueuedLoader((torch.zeros(4, 1), torch.zeros(4)) for _ in range(20))
    mon = data.measure(batches, lambda batch: None, steps=8, warmup=3)
    assert len(mon.steps) == 8 + 6 and len(mon.steady()) == 8 - 3      # 6 queued batches more, all skipped


def test_the_table_predicts_with_the_model_it_is_given():
    mons = {w: _monitor_of(0.01, 0.02) for w in (0, 2)}
    fit = {"t_load": 0.01, "t_compute": 0.02}
    rows = data.table(mons, fit, predict=lambda workers, **f: 0.1 * (workers + 1))
    assert [r["predicted_ms"] for r in rows] == [100.0, 300.0]
    assert data.table(mons, fit)[0]["predicted_ms"] == pytest.approx(30.0)       # the kit's: t_load + t_compute


def _monitor_of(wait_s, compute_s, steps=6):
    mon = monitor.Monitor(warmup=0, nvml=False)
    for _ in range(steps):
        mon.record(wait_s, compute_s, samples=4)
    return mon


def test_the_exercises_are_graded_without_showing_the_answer():
    from kit.data import lesson
    fit = dict(t_load=0.2, t_load_cpu=0.05, t_compute=0.4, c_compute=0.075, cores=2)      # W_eff(8) = 3.2
    assert lesson.grade(1, None, fit) == "exercise 1: not answered yet"
    assert lesson.grade(1, 3.2, fit) == "exercise 1: correct" and lesson.grade(1, 8, fit) == "exercise 1: wrong"
    assert lesson.grade(2, 3) == "exercise 2: correct" and lesson.grade(2, 4) == "exercise 2: wrong"   # 90 ms / 30
    assert lesson.grade(3, 0.5) == "exercise 3: correct" and lesson.grade(3, 0.25) == "exercise 3: wrong"
    with pytest.raises(ValueError, match="exercise must be 1, 2 or 3, got 4"):
        lesson.grade(4, 1)
