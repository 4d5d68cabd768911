"""kit.mnist and scripts/train_keras_mnist.py: the model, sharding, atomic checkpoints and resume, the timeline
parser, and the script under horovodrun (Gloo) and mpirun, killed mid-way and resumed."""
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from kit import mnist
from kit.mnist import timeline

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SCRIPT = str(REPO / "scripts" / "train_keras_mnist.py")
TINY = ["--dataset", "digits", "--train-samples", "512", "--batch-size", "32"]


def horovodrun(*args):
    return [str(BIN / "horovodrun"), "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, SCRIPT, *args]


def mpirun(*args):
    return [str(BIN / "mpirun"), "--oversubscribe", "-np", "2", sys.executable, SCRIPT, *args]


def run(cmd, timeout=240):
    p = subprocess.run(cmd, env=mnist.launch_env(), capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout + p.stderr


# ----------------------------------------------------------------------------------- pieces
def test_model_is_the_classic_keras_mnist_cnn():
    model = mnist.build_model()
    assert model.count_params() == 1_199_882          # the classic example's parameter count
    assert model.output_shape == (None, 10)
    assert [type(layer).__name__ for layer in model.layers] == [
        "Conv2D", "Conv2D", "MaxPooling2D", "Dropout", "Flatten", "Dense", "Dropout", "Dense"]


def test_shards_are_disjoint_equal_and_cover_the_data():
    x, y = np.arange(103), np.arange(103) * 10
    shards = [mnist.shard(x, y, r, 4) for r in range(4)]
    assert {len(s[0]) for s in shards} == {25}        # equal lengths: every rank runs the same steps
    seen = np.concatenate([s[0] for s in shards])
    assert len(set(seen)) == 100 and all((s[1] == s[0] * 10).all() for s in shards)


def test_n_workers_see_as_many_samples_as_one_process():
    """Sharded data and the same epochs: N workers pass over every image as often as one process does, in the
    steps Keras' fit runs (the last, partial batch of a shard is a step)."""
    n = 60_000
    for size in (1, 2, 3, 4, 7, 8):
        per_rank = len(mnist.shard(np.arange(n), np.arange(n), 0, size)[0])
        steps = mnist.steps_per_epoch(n, size)
        assert (steps - 1) * mnist.BATCH < per_rank <= steps * mnist.BATCH     # ceil: every image of the shard
        assert n - size < size * per_rank <= n                              # all images, up to size - 1
    assert mnist.steps_per_epoch(60_000, 4) == 118 and mnist.steps_per_epoch(256, 1, 128) == 2


def compiled_model():
    import tensorflow as tf
    model = mnist.build_model()
    model.compile(loss="sparse_categorical_crossentropy", optimizer=tf.keras.optimizers.Adam(mnist.BASE_LR))
    rng = np.random.default_rng(0)
    model.fit(rng.random((64, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, 64), batch_size=32, verbose=0)
    return model


def test_checkpoint_roundtrip_keeps_weights_and_optimizer_state(tmp_path):
    model = compiled_model()
    path = mnist.save_checkpoint(tmp_path, 3, model)
    assert path.name == "ckpt-epoch-0003.npz" and not list(tmp_path.glob(".tmp-*"))   # temp file renamed
    import tensorflow as tf
    fresh = mnist.build_model()
    fresh.compile(loss="sparse_categorical_crossentropy", optimizer=tf.keras.optimizers.Adam(mnist.BASE_LR))
    state = mnist.latest_good_checkpoint(tmp_path, fresh)
    mnist.checkpoint.restore(fresh, state)
    assert state["epoch"] == 3 and mnist.weights_digest(fresh) == mnist.weights_digest(model)
    variables = mnist.checkpoint.optimizer_variables
    for a, b in zip(variables(model.optimizer), variables(fresh.optimizer)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert int(fresh.optimizer.iterations.numpy()) == 2


def test_corrupt_checkpoint_is_skipped_with_a_warning(tmp_path, capsys):
    model = compiled_model()
    for epoch in (1, 2, 3, 4):
        mnist.save_checkpoint(tmp_path, epoch, model, keep=3)
    assert [p.name for p in mnist.list_checkpoints(tmp_path)] == [f"ckpt-epoch-000{e}.npz" for e in (2, 3, 4)]
    newest = tmp_path / "ckpt-epoch-0004.npz"
    newest.write_bytes(newest.read_bytes()[:1000])     # a half-written file, as a crash without rename leaves
    assert mnist.latest_good_checkpoint(tmp_path, model)["epoch"] == 3
    assert "WARNING: ignoring corrupt checkpoint" in capsys.readouterr().err


TIMELINE = """[
{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "a/b/HorovodAllreduce_grads_4_0"}},
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 1000, "pid": 1},{"ph": "X", "name": "0", "ts": 1001, "pid": 1},
{"ph": "E", "ts": 3000, "pid": 1},{"ph": "B", "name": "ALLREDUCE", "ts": 3000, "pid": 1},
{"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 3100, "pid": 1},{"ph": "E", "ts": 7100, "pid": 1},
{"ph": "E", "ts": 7200, "pid": 1},"""


@pytest.mark.engines
def test_a_start_that_stalls_ends_the_rank_with_a_message_and_a_bad_bound_is_refused():
    """hvd.init() that never returns (Open MPI's first collective stalled, docs/cluster.md) ends the rank, with its
    exit status and a message, after --init-timeout; one that returns in time is left alone."""
    code = ("import sys, time, types; from kit.mnist import train\n"
            "hang = types.SimpleNamespace(init=lambda: time.sleep(60))\n"
            "quick = types.SimpleNamespace(init=lambda: time.sleep(0.1))\n"
            "train.init_within(quick, 0.5); time.sleep(0.6); print('quick ok', flush=True)\n"
            "train.init_within(hang, 0.5); print('not reached')\n")
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    from kit.mnist import train
    assert p.returncode == train.INIT_STALLED, (p.returncode, p.stderr)
    assert p.stdout == "quick ok\n" and time.time() - t0 < 30
    assert f"{train.STALLED} 0.5 s" in p.stderr and "--init-timeout" in p.stderr, p.stderr
    with pytest.raises(SystemExit):
        train.parse_args(["--init-timeout", "-1"])
    for bad in (["--as-workers", "0"], ["--as-workers", "2", "--elastic"]):     # the control is one plain process
        with pytest.raises(SystemExit):
            train.parse_args(bad)
    assert train.parse_args(["--init-timeout", "0"]).init_timeout == 0


def test_timeline_parser_reads_an_unfinished_file_and_plots(tmp_path):
    path = tmp_path / "timeline.json"
    path.write_text(TIMELINE)                           # Horovod leaves the JSON list open while running
    rows = mnist.read_timeline(path)
    assert [(r["tensor"], r["phase"], r["depth"]) for r in rows] == [
        ("grads_4", "NEGOTIATE_ALLREDUCE", 0), ("grads_4", "ALLREDUCE", 0), ("grads_4", "GLOO_ALLREDUCE", 1)]
    assert timeline.timeline_summary(rows) == pytest.approx(
        {"NEGOTIATE_ALLREDUCE": 0.002, "ALLREDUCE": 0.0042, "GLOO_ALLREDUCE": 0.004})
    import matplotlib
    matplotlib.use("Agg")
    ax = mnist.plot_timeline(rows)
    assert len(ax.collections) == 3 and ax.get_yticklabels()[0].get_text() == "grads_4"



def test_per_step_splits_a_timeline_at_the_first_gradient_and_counts_each_instant_once(tmp_path):
    """Two steps of tensors a (produced first) and b. Step 1: a negotiates 0-2 ms, b 1-5, one fused allreduce 5-9.
    Step 2 (from 20 ms): a negotiates 20-20.5 and goes alone 21-23; b negotiates 20.6-30 and goes 30-33."""
    ev = [{"name": "process_name", "ph": "M", "pid": p, "args": {"name": n}} for p, n in ((1, "a"), (2, "b"))]
    for pid, spans in ((1, [(0, 2, 5, 9), (20, 20.5, 21, 23)]), (2, [(1, 5, 5, 9), (20.6, 30, 30, 33)])):
        for n0, n1, w0, w1 in spans:
            ev += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 1e3 * n0, "pid": pid},
                   {"ph": "E", "ts": 1e3 * n1, "pid": pid},
                   {"ph": "B", "name": "ALLREDUCE", "ts": 1e3 * w0, "pid": pid},
                   {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 1e3 * w0, "pid": pid},
                   {"ph": "E", "ts": 1e3 * w1, "pid": pid}, {"ph": "E", "ts": 1e3 * w1, "pid": pid}]
    ev += [{"ph": "i", "name": "CYCLE_START", "ts": 1e3 * t, "s": "g"} for t in (1, 3, 21, 25)]
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(ev)[:-1] + ",")          # left open, as Horovod leaves it while running
    steps = timeline.per_step(path)
    ms = [{k: round(1e3 * v, 6) if isinstance(v, float) else v for k, v in st.items()} for st in steps]
    assert ms == [{"span": 9.0, "wire": 4.0, "negotiation": 5.0, "idle": 0.0, "allreduces": 1, "cycles": 2},
                  {"span": 13.0, "wire": 5.0, "negotiation": 9.9, "idle": 0.1, "allreduces": 2, "cycles": 2}]
    assert timeline.read_cycles(path) == pytest.approx([0.001, 0.003, 0.021, 0.025])


def test_exchange_per_step_counts_fused_and_overlapping_transfers_once():
    """Two steps; in each, grads_0 goes alone (1 ms) and grads_4/grads_5 share one fused transfer (10 ms, their
    recorded starts 0.1 ms apart), overlapping grads_0's by 0.5 ms: 10.5 ms of wall clock per step, not 21."""
    def span(tensor, phase, start_ms, end_ms, depth):
        return {"tensor": tensor, "phase": phase, "depth": depth, "start": start_ms / 1e3, "end": end_ms / 1e3}
    rows = []
    for t in (0.0, 100.0):
        rows += [span("grads_0", "NEGOTIATE_ALLREDUCE", t - 5, t, 0), span("grads_0", "ALLREDUCE", t, t + 1.2, 0),
                 span("grads_0", "GLOO_ALLREDUCE", t, t + 1, 1),
                 span("grads_4", "GLOO_ALLREDUCE", t + 0.5, t + 10.5, 1),
                 span("grads_5", "GLOO_ALLREDUCE", t + 0.6, t + 10.5, 1),
                 span("grads_5", "MEMCPY_IN_FUSION_BUFFER", t + 20, t + 30, 1)]
    assert timeline.allreduce_seconds_per_step(rows) == pytest.approx(0.0105)
    assert timeline.allreduce_seconds_per_step(rows, skip_steps=1) == pytest.approx(0.0105)
    with pytest.raises(ValueError, match="the timeline has 2 steps: cannot leave out 2"):
        timeline.allreduce_seconds_per_step(rows, skip_steps=2)

# ----------------------------------------------------------------------------------- the script
def check_trained(out: str, json_path: Path, epochs: int):
    assert "data set: digits" in out and "replicas identical: True" in out
    result = json.loads(json_path.read_text())
    assert result["size"] == 2 and result["replicas_identical"] and len(result["history"]) == epochs
    assert result["test_accuracy"] > 0.2                # well above chance (0.1) even after a few tiny epochs
    return result


@pytest.mark.timeout(900)   # horovodrun/mpirun jobs: minutes on a busy 2-core machine
@pytest.mark.engines
def test_script_under_mpirun_warms_up_then_decays_the_learning_rate(tmp_path, no_leaks):
    out = run(mpirun(*TINY, "--epochs", "4", "--warmup-epochs", "1", "--json", str(tmp_path / "r.json")))
    lrs = [h["lr"] for h in check_trained(out, tmp_path / "r.json", 4)["history"]]
    scaled = mnist.BASE_LR * 2                             # Horovod (3): the rate x size
    assert mnist.decay_start(4) == 3                       # the last quarter: the 4th epoch
    assert lrs[1:3] == pytest.approx([scaled] * 2) and lrs[3] == pytest.approx(scaled * mnist.DECAY)
    # The control (kit.bench mnist's third arm): one process trained as these 2 workers are, 2x the batch, follows
    # the same rates epoch for epoch (Horovod's own warmup callback would read size 1 there and not ramp at all).
    one = [str(BIN / "horovodrun"), "--gloo", "-np", "1", "-H", "localhost:1", sys.executable, SCRIPT]
    out = run(one + [*TINY, "--epochs", "4", "--warmup-epochs", "1", "--as-workers", "2",   # TINY: 32 per worker
                     "--json", str(tmp_path / "c.json")])
    control = json.loads((tmp_path / "c.json").read_text())
    assert "as 2 workers: batch 64" in out and (control["size"], control["as_workers"]) == (1, 2)
    assert [h["lr"] for h in control["history"]] == pytest.approx(lrs)


def test_decay_start_is_the_last_quarter_and_a_stored_spread_of_another_schedule_is_not_used(tmp_path, monkeypatch):
    assert [mnist.decay_start(e) for e in (1, 2, 3, 4, 12, 20)] == [1, 2, 3, 3, 9, 15]   # 1-3 epochs: no decay
    seeds = {"2_workers": [0.8, 0.81, 0.82], "1_process": [0.8, 0.8, 0.81]}
    doc = {"dataset": "fashion_mnist", "subset": [6000, 2000], "epochs": 12, "accuracy_seeds": seeds}
    (tmp_path / "results").mkdir()
    monkeypatch.setattr(mnist.accuracy, "REPO", tmp_path)
    for schedule, expected in ((mnist.SCHEDULE, {**seeds, "long": None}), ("warmup 3 epochs", None), (None, None)):
        (tmp_path / "results" / "mnist.json").write_text(json.dumps({**doc, "schedule": schedule}))
        assert mnist.accuracy_spread("fashion_mnist", (6000, 2000), 12) == expected
    assert mnist.accuracy_spread("fashion_mnist", (6000, 2000), 10) is None        # other epochs


@pytest.mark.timeout(900)   # horovodrun/mpirun jobs: minutes on a busy 2-core machine
@pytest.mark.engines
def test_killed_run_resumes_from_the_last_good_checkpoint_skipping_a_corrupt_one(tmp_path, no_leaks):
    ckpt, total = tmp_path / "ckpt", 40
    # 1. Start a long run and kill the whole job once rank 0 has written two checkpoints.
    p = subprocess.Popen(horovodrun(*TINY, "--epochs", str(total), "--checkpoint-dir", str(ckpt)),
                         env=mnist.launch_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.time() + 180
    while len(mnist.list_checkpoints(ckpt)) < 2 and p.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    done = [int(mnist.CKPT_RE.search(c.name)[1]) for c in mnist.list_checkpoints(ckpt)]
    assert len(done) >= 2 and max(done) < total, f"not killed mid-way: checkpoints {done}"
    # 2. The newest checkpoint made corrupt (a disk that filled up, a copy cut short), then started
    #    again with the same --checkpoint-dir: warned about, the one before it is used, and the job finishes. (The
    #    newest good checkpoint resumed across hosts: test_netlab's killed-and-resumed, Gloo and MPI.)
    *_, before, newest = mnist.list_checkpoints(ckpt)
    newest.write_bytes(b"half a checkpoint")
    good, last = int(mnist.CKPT_RE.search(before.name)[1]), max(done)
    out = run(horovodrun(*TINY, "--epochs", str(last + 1), "--checkpoint-dir", str(ckpt),
                         "--json", str(tmp_path / "r.json")))
    assert "WARNING: ignoring corrupt checkpoint" in out and f"resumed from epoch {good}" in out, out[-3000:]
    # 3. The resumed job is the script under horovodrun --gloo, checked as any run of it (the MPI launcher:
    #    test_script_under_mpirun_*): 2 workers on disjoint halves, identical replicas, above chance.
    assert "training on 2 worker(s), 256 images each" in out, out[-3000:]
    history = [h["epoch"] for h in check_trained(out, tmp_path / "r.json", last + 1 - good)["history"]]
    assert history == list(range(good + 1, last + 2)), out[-3000:]


# ----------------------------------------------------------------------------------- GPU pinning (notebook 04)
# notebook 04 and its appendix (the PyTorch section and the 1-vs-N throughput pairs live in 04a)
NOTEBOOKS = [REPO / "notebooks" / "04_horovod_keras_mnist.ipynb",
             REPO / "notebooks" / "appendix" / "04a_horovod_timeline_scaling.ipynb"]


def code_cell(marker: str) -> str:
    """Return the code of the one code cell of notebook 04 or its appendix 04a that contains `marker`."""
    cells = ["".join(c["source"]) for nb in NOTEBOOKS for c in json.loads(nb.read_text())["cells"]
             if c["cell_type"] == "code"]
    found = [c for c in cells if marker in c]
    assert len(found) == 1, f"expected one cell with {marker!r}, found {len(found)}"
    return found[0]


def px_cell(marker: str) -> str:
    """Return the code of notebook 04's (or 04a's) %%px cell that contains `marker`, as the engines run it."""
    return code_cell(marker).removeprefix("%%px\n")


def fake_hvd(rank, local_rank):
    return types.SimpleNamespace(rank=lambda: rank, size=lambda: 2, local_rank=lambda: local_rank, init=lambda: None)


@pytest.mark.parametrize("local_rank", [0, 1, 3])
def test_keras_gpu_pinning_cell_uses_the_engines_one_visible_gpu(local_rank, monkeypatch):
    """Under kit.cluster each engine sees one GPU (CUDA_VISIBLE_DEVICES): the cell must pick it on every rank."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(local_rank))
    calls = []
    config = types.SimpleNamespace(
        list_physical_devices=lambda kind: ["/physical_device:GPU:0"] if kind == "GPU" else [],
        set_visible_devices=lambda dev, kind: calls.append(("visible", dev, kind)),
        experimental=types.SimpleNamespace(set_memory_growth=lambda dev, on: calls.append(("growth", dev, on))),
        threading=types.SimpleNamespace(set_inter_op_parallelism_threads=lambda n: calls.append(("inter", n))))
    pinned = []
    fake_mnist = types.SimpleNamespace(pin_to_core=lambda lr: pinned.append(lr) or 0)
    exec(px_cell("set_visible_devices"), {"tf": types.SimpleNamespace(config=config),
                                          "hvd": fake_hvd(local_rank, local_rank), "mnist": fake_mnist})
    assert calls == [("growth", "/physical_device:GPU:0", True), ("visible", "/physical_device:GPU:0", "GPU")]
    assert pinned == []                                      # a GPU process is not pinned to a core


def test_keras_gpu_pinning_cell_without_gpu_pins_a_core(monkeypatch, capsys):
    config = types.SimpleNamespace(list_physical_devices=lambda kind: [],
                                   threading=types.SimpleNamespace(set_inter_op_parallelism_threads=lambda n: None))
    pinned = []
    fake_mnist = types.SimpleNamespace(pin_to_core=lambda lr: pinned.append(lr) or 5)
    exec(px_cell("set_visible_devices"), {"tf": types.SimpleNamespace(config=config), "hvd": fake_hvd(1, 1),
                                          "mnist": fake_mnist})
    assert pinned == [1] and "rank 1 pinned to core 5" in capsys.readouterr().out


def test_torch_gpu_pinning_cell_sets_device_0_on_every_rank(monkeypatch):
    """The PyTorch section calls torch.cuda.set_device on the engine's one visible GPU (device 0)."""
    set_to = []
    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1,
                                            set_device=lambda i: set_to.append(i))
    fake_torch.device = lambda name: f"device({name})"
    fake_hvd_torch = types.ModuleType("horovod.torch")
    fake_hvd_torch.__dict__.update(vars(fake_hvd(1, 1)))
    fake_horovod = types.ModuleType("horovod")
    fake_horovod.torch = fake_hvd_torch
    for name, mod in (("torch", fake_torch), ("horovod", fake_horovod), ("horovod.torch", fake_hvd_torch)):
        monkeypatch.setitem(sys.modules, name, mod)
    ns = {}
    exec(px_cell("torch.cuda.set_device"), ns)
    assert set_to == [0] and ns["device"] == "device(cuda)"
    assert fake_torch.cuda.device_count() > max(set_to)     # a valid index with one visible GPU


# ----------------------------------------------------------------------------------- one experiment, two callers
def test_paired_runs_pairs_one_and_many_and_takes_medians():
    thr = iter([100.0, 180.0, 110.0, 160.0, 90.0, 200.0])
    res = mnist.paired_runs(lambda: {"samples_per_s": next(thr), "cores_busy": [1.0]},
                            lambda: {"samples_per_s": next(thr), "cores_busy": [1.0, 1.0]}, repeats=3, n=2)
    assert [(r["thr_1"], r["thr_n"]) for r in res["runs"]] == [(100, 180), (110, 160), (90, 200)]
    assert res["median_thr_1"] == 100 and res["median_thr_n"] == 180
    assert res["speedup"] == pytest.approx(1.8) and res["efficiency"] == pytest.approx(0.9)   # median of ratios


def test_notebook_04_measures_with_the_benchmarks_function():
    assert "mnist.paired_runs(" in code_cell("mnist.engine_throughput")


@pytest.mark.timeout(900)
@pytest.mark.engines
def test_bench_mnist_smoke_run_at_a_tiny_size(tmp_path, no_leaks):
    from kit import bench
    summary = bench.run("mnist", tmp_path, tiny=True)   # the Gloo pair; the MPI launcher: test_script_under_mpirun_*
    doc = json.loads((tmp_path / "mnist.json").read_text())
    assert summary.startswith("mnist: digits test accuracy") and doc["summary"] == summary
    assert set(doc["throughput"]) == {"pinned"}          # tiny: one pair (quick adds the MPI pair)
    assert all(t["runs"][0]["thr_1"] > 0 and t["runs"][0]["thr_n"] > 0 for t in doc["throughput"].values())
    assert doc["replicas_identical"] is True and [len(v) for v in doc["accuracy_seeds"].values()] == [1, 1, 1]
    assert (tmp_path / "mnist.png").stat().st_size > 0 and (tmp_path / "mnist_timeline.png").stat().st_size > 0
    assert not (tmp_path / "mnist_timeline.json").exists()


def test_lab_scaling_leaves_out_the_pairs_asked_and_its_figure_draws_the_rest(monkeypatch):
    """kit.mnist.lab.scaling(skip=...) (notebook 04 takes LAB_SKIP for it): the pairs asked for
    run in order, the lab's rate is restored, and plot_lab_scaling draws a grid with a gap."""
    from kit.mnist import lab as mlab
    from kit.plots import plot_lab_scaling
    import matplotlib.pyplot as plt

    class FakeLab:
        rate, rates = "1gbit", []

        def set_rate(self, rate):
            self.rate = rate
            self.rates.append(rate)

    def fake_run(lab, n, steps):
        calls.append((n, lab.rate))
        return {"n": n, "rate": lab.rate, "samples_per_s": 100.0 * n, "step_s": 0.1, "allreduce_s": 0.01 * (n > 1),
                "allreduce_share": 0.1 * (n > 1), "cores_busy": [1.0] * n}

    calls, lab = [], FakeLab()
    monkeypatch.setattr(mlab, "run_on_lab", fake_run)
    result = mlab.scaling(lab, sizes=(2, 4), rates=("1gbit", "10gbit"), steps=5, skip=((4, "1gbit"),))
    assert calls == [(1, "1gbit"), (2, "1gbit"), (2, "10gbit"), (4, "10gbit")]
    assert lab.rate == "1gbit" and lab.rates[-1] == "1gbit"
    assert [(r["n"], r["rate"], r["speedup"]) for r in result["runs"]] == [(2, "1gbit", 2.0), (2, "10gbit", 2.0),
                                                                          (4, "10gbit", 4.0)]
    assert mlab.table(result).count("\n") == 5
    ax = plot_lab_scaling(result)
    assert len(ax[0].patches) == 3                  # one bar per run: none for the pair left out
    plt.close("all")


def test_the_accuracy_table_gives_each_arm_and_seed():
    two = {"epochs": 12, "schedule": mnist.SCHEDULE, "dataset": "fashion_mnist", "seeds": [0, 1, 2],
           "accuracy_seeds": {"2_workers": [0.829, 0.838, 0.8385], "1_process": [0.8515, 0.852, 0.857],
                              mnist.accuracy.CONTROL: [0.85, 0.852, 0.856]},
           "accuracy_long": {"epochs": 24, "2_workers": [0.863, 0.868, 0.87], "1_process": [0.864, 0.869, 0.87]}}
    table = mnist.accuracy_table(two).splitlines()
    assert table[0] == "| fashion_mnist | seed 0 | seed 1 | seed 2 | median | spread |" and len(table) == 7
    assert table[4] == "| 1 process as 2 workers, 12 epochs | 85.00% | 85.20% | 85.60% | 85.20% | 0.60 points |"
    assert table[5] == "| 2 workers, 24 epochs | 86.30% | 86.80% | 87.00% | 86.80% | 0.70 points |"
    assert [c.held for c in mnist.bench_checks(two)] == [False, False, True]
