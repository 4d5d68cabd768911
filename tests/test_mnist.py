"""kit.mnist and scripts/train_keras_mnist.py: the model, sharding, atomic checkpoints and resume, the timeline
parser, and the script under horovodrun (Gloo) and mpirun, killed mid-way and resumed."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kit import mnist

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


def test_epochs_follow_ceil_12_over_size():
    assert [mnist.epochs_for(n) for n in (1, 2, 3, 4, 5, 8, 16)] == [12, 6, 4, 3, 3, 2, 1]


def compiled_model():
    import tensorflow as tf
    model = mnist.build_model()
    model.compile(loss="sparse_categorical_crossentropy", optimizer=tf.keras.optimizers.Adadelta(1.0))
    rng = np.random.default_rng(0)
    model.fit(rng.random((64, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, 64), batch_size=32, verbose=0)
    return model


def test_checkpoint_roundtrip_keeps_weights_and_optimizer_state(tmp_path):
    model = compiled_model()
    path = mnist.save_checkpoint(tmp_path, 3, model)
    assert path.name == "ckpt-epoch-0003.npz" and not list(tmp_path.glob(".tmp-*"))   # temp file renamed
    import tensorflow as tf
    fresh = mnist.build_model()
    fresh.compile(loss="sparse_categorical_crossentropy", optimizer=tf.keras.optimizers.Adadelta(1.0))
    state = mnist.latest_good_checkpoint(tmp_path, fresh)
    mnist.restore(fresh, state)
    assert state["epoch"] == 3 and mnist.weights_digest(fresh) == mnist.weights_digest(model)
    for a, b in zip(mnist.optimizer_variables(model.optimizer), mnist.optimizer_variables(fresh.optimizer)):
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


def test_timeline_parser_reads_an_unfinished_file_and_plots(tmp_path):
    path = tmp_path / "timeline.json"
    path.write_text(TIMELINE)                           # Horovod leaves the JSON list open while running
    rows = mnist.read_timeline(path)
    assert [(r["tensor"], r["phase"], r["depth"]) for r in rows] == [
        ("grads_4", "NEGOTIATE_ALLREDUCE", 0), ("grads_4", "ALLREDUCE", 0), ("grads_4", "GLOO_ALLREDUCE", 1)]
    assert mnist.timeline_summary(rows) == pytest.approx(
        {"NEGOTIATE_ALLREDUCE": 0.002, "ALLREDUCE": 0.0042, "GLOO_ALLREDUCE": 0.004})
    import matplotlib
    matplotlib.use("Agg")
    ax = mnist.plot_timeline(rows)
    assert len(ax.collections) == 3 and ax.get_yticklabels()[0].get_text() == "grads_4"


# ----------------------------------------------------------------------------------- the script
def check_trained(out: str, json_path: Path, epochs: int):
    assert "data set: digits" in out and "replicas identical: True" in out
    result = json.loads(json_path.read_text())
    assert result["size"] == 2 and result["replicas_identical"] and len(result["history"]) == epochs
    assert result["test_accuracy"] > 0.2                # well above chance (0.1) even after a few tiny epochs
    return result


def test_script_under_horovodrun_gloo(tmp_path, no_leaks):
    out = run(horovodrun(*TINY, "--epochs", "3", "--json", str(tmp_path / "r.json")))
    assert "training on 2 worker(s), 256 images each" in out
    check_trained(out, tmp_path / "r.json", 3)


def test_script_under_mpirun(tmp_path, no_leaks):
    out = run(mpirun(*TINY, "--epochs", "2", "--json", str(tmp_path / "r.json")))
    check_trained(out, tmp_path / "r.json", 2)


def test_killed_run_resumes_from_last_checkpoint_and_skips_a_corrupt_one(tmp_path, no_leaks):
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
    last = max(done)
    # 2. Start again with the same --checkpoint-dir: resumes after the last checkpoint, finishes the job.
    out = run(horovodrun(*TINY, "--epochs", str(last + 2), "--checkpoint-dir", str(ckpt),
                         "--json", str(tmp_path / "r.json")))
    assert f"resumed from epoch {last}" in out
    assert [h["epoch"] for h in json.loads((tmp_path / "r.json").read_text())["history"]] == [last + 1, last + 2]
    # 3. A corrupt newest checkpoint: warned about, and the previous good one is used.
    newest = mnist.list_checkpoints(ckpt)[-1]
    newest.write_bytes(b"half a checkpoint")
    out = run(horovodrun(*TINY, "--epochs", str(last + 3), "--checkpoint-dir", str(ckpt)))
    assert "WARNING: ignoring corrupt checkpoint" in out and f"resumed from epoch {last + 1}" in out
    assert re.search(rf"epoch +{last + 2}/{last + 3}", out) and "replicas identical: True" in out
