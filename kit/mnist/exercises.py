"""Notebook 04's exercise checkers, written once for the notebook and its solutions: each says correct, wrong (and
which part) or not answered yet, never the answer.

    print(exercises.check_exercise_1(cluster.view, drift))            # on the engines: step 5 left out
    print(exercises.check_exercise_2(steps, images))                  # steps per rank, images in 12 epochs
    print(exercises.check_exercise_3(CKPT_DIR, epoch))                # the epoch resume() loads after a corruption
    print(exercises.check_exercise_4(cluster, horovodize))            # on the engines: steps 3-5 in a function
"""
from __future__ import annotations

import contextlib
import io

CORRUPT = b"not a checkpoint"     # what exercise 3 writes over the newest checkpoint
EX2 = dict(images=60_000, workers=4, epochs=12)


def engine_state(broken) -> dict | None:
    """Return what exercise 1's grader reads from this engine's `broken` model (None while it is unset)."""
    if broken is None:
        return None
    from kit.mnist.model import weights_digest
    opt = getattr(broken, "optimizer", None)
    steps = int(opt.iterations.numpy()) if opt is not None and hasattr(opt, "iterations") else 0
    return {"steps": steps, "averaged": hasattr(opt, "_allreduce"), "digest": weights_digest(broken),
            "weights": broken.get_weights()}


def largest_drift(weights) -> float:
    """The largest |w - w_rank0| over every rank's weights (`weights[r]`: rank r's list of arrays)."""
    import numpy as np
    return max((float(np.max(np.abs(np.asarray(w, float) - np.asarray(w0, float)))) if np.size(w) else 0.0
                for ws in weights for w, w0 in zip(ws, weights[0])), default=0.0)


def _cases(weights: list) -> list:
    """The grader's weights: the ranks' own, then made-up ones (identical; one element off, up or down)."""
    import numpy as np
    same = [[np.array(w, float) for w in weights[0]] for _ in weights]
    up = [[w.copy() for w in ws] for ws in same]
    up[-1][-1].flat[-1] += 0.5
    down, first = [[w.copy() for w in ws] for ws in same], [[w.copy() for w in ws] for ws in same]
    down[-1][0].flat[0] -= 0.25
    first[0][-1].flat[0] += 0.75                    # rank 0 itself off: every other rank differs from it
    return [weights, same, up, down, first, same[:1]]


def grade_1(states: list, drift) -> str:
    """Grade exercise 1 from every rank's engine_state and the learner's `drift(weights) -> float`, the largest
    |w - w_rank0| over every rank and every weight."""
    if any(s is None for s in states) or drift is None:
        return "exercise 1: not answered yet"
    if any(s["steps"] < 1 for s in states) or len({s["steps"] for s in states}) != 1:
        return "exercise 1: wrong: every rank must train `broken` for the same few steps (at least one)"
    if not all(s["averaged"] for s in states):
        return "exercise 1: wrong: only step 5 should be missing: `broken`'s optimizer must still average gradients"
    if len({s["digest"] for s in states}) == 1:
        return ("exercise 1: wrong: the replicas ended identical, so something still made them equal: train "
                "without every step that copies rank 0's weights")
    try:
        got = [drift(ws) for ws in _cases([s["weights"] for s in states])]
        right = all(isinstance(g, (int, float)) and abs(g - largest_drift(ws)) <= 1e-6 * max(1.0, abs(g))
                    for g, ws in zip(got, _cases([s["weights"] for s in states])))
    except Exception as e:          # the learner's check raised: say so, not the answer
        return f"exercise 1: wrong: your check raised {type(e).__name__}: {e}"
    return "exercise 1: correct" if right else \
        "exercise 1: the training is right, your drift is wrong: the largest |w - w_rank0|, a number, for any weights"


def check_exercise_1(view, drift) -> str:
    """Grade exercise 1 on the engines of `view`: each rank's `broken` model, and the learner's drift."""
    import ipyparallel as ipp
    return grade_1(view.apply_sync(engine_state, ipp.Reference("broken")), drift)


def check_exercise_2(steps, images) -> str:
    """Grade exercise 2: each rank's steps per epoch and the job's images in 12 epochs (4 workers, 60,000 images)."""
    if steps is None or images is None:
        return "exercise 2: not answered yet"
    from kit.mnist.model import shard, steps_per_epoch
    import numpy as np
    n, w = EX2["images"], EX2["workers"]
    right_steps = steps == steps_per_epoch(n, w)
    right_images = images == EX2["epochs"] * w * len(shard(np.arange(n), np.arange(n), 0, w)[0])
    if right_steps and right_images:
        return "exercise 2: correct"
    return (f"exercise 2: steps per rank {'right' if right_steps else 'wrong'}, "
            f"images {'right' if right_images else 'wrong'}")


def corrupt_newest(ckpt_dir) -> None:
    """Write a few bytes over the newest checkpoint in ckpt_dir, once (a second call leaves the others alone)."""
    from kit.mnist.checkpoint import list_checkpoints
    files = list_checkpoints(ckpt_dir)
    if not files:
        raise ValueError(f"ckpt_dir={str(ckpt_dir)!r} holds no checkpoint: train first (it needs at least one)")
    if files[-1].read_bytes() != CORRUPT:
        files[-1].write_bytes(CORRUPT)


def check_exercise_3(ckpt_dir, resume_epoch) -> str:
    """Grade exercise 3: corrupt the newest checkpoint, then compare `resume_epoch` with the one resume() loads."""
    from kit.mnist.checkpoint import latest_good_checkpoint
    corrupt_newest(ckpt_dir)
    with contextlib.redirect_stderr(io.StringIO()) as err:      # quietly: its warning names the file, the answer
        found = latest_good_checkpoint(ckpt_dir)
    skipped = err.getvalue().count("ignoring corrupt checkpoint")
    said = f"(resume() skipped {skipped} unreadable checkpoint{'s' if skipped != 1 else ''})"
    if resume_epoch is None:
        return "exercise 3: not answered yet"           # what resume() skipped is said only with an answer
    if found is None:
        return f"exercise 3: {'correct' if resume_epoch == 0 else 'wrong'} {said}"
    return f"exercise 3: {'correct' if resume_epoch == found['epoch'] else 'wrong'} {said}"


EX4 = dict(base_lr=0.01, batch=8, steps=2)          # exercise 4's run: two steps of 8 rank-dependent samples


def _run_horovodize(fn) -> dict:
    """On an engine: a tiny model with this rank's own random weights, the learner's `fn(model, base_lr)`, then two
    steps of `fit` on this rank's own data (only when every rank's fn returned the same kinds of callbacks, so
    that no rank waits in a collective the others skip); report the learning rate and each step's weights."""
    import horovod.tensorflow as htf
    import horovod.tensorflow.keras as hvd
    import numpy as np
    from kit.mnist.model import weights_digest
    from kit.mnist.tfimport import import_tf_quietly
    tf = import_tf_quietly()
    hvd.init()
    for name, mod in (("hvd", hvd), ("tf", tf)):      # the names the notebook's engines have, for the learner's fn
        getattr(fn, "__globals__", {}).setdefault(name, mod)
    rank = hvd.rank()
    tf.keras.utils.set_random_seed(400 + rank)        # every rank starts from its own weights
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(6, activation="relu", name="ex4_in"),
                                 tf.keras.layers.Dense(3, name="ex4_out")], name="ex4")
    report: dict = {"rank": rank, "size": hvd.size()}
    try:
        callbacks = fn(model, EX4["base_lr"])
        callbacks = list(callbacks) if callbacks is not None else []
        opt = getattr(model, "optimizer", None)
        report["compiled"] = opt is not None
        if opt is not None:
            report["lr"] = float(tf.keras.backend.get_value(opt.learning_rate))
            report["kinds"] = sorted(type(c).__name__ for c in callbacks)
    except NotImplementedError:
        report["unanswered"] = True
    except Exception as e:                            # the learner's error, reported with its rank
        report["error"] = f"{type(e).__name__}: {e}"
    every = htf.allgather_object(report.get("kinds"))     # every rank gets here: fit only if all can
    if report.get("kinds") is None or any(k != every[0] for k in every):
        return report
    digests: list[str] = []
    record = tf.keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: digests.append(weights_digest(model)))
    rng = np.random.default_rng(rank)
    n = EX4["batch"] * EX4["steps"]
    x, y = rng.normal(size=(n, 8)).astype("float32"), rng.integers(0, 3, n)
    model.fit(x, y, batch_size=EX4["batch"], epochs=1, shuffle=False, verbose=0, callbacks=callbacks + [record])
    return {**report, "digests": digests}


def judge_4(reports: list[dict], base_lr: float = EX4["base_lr"]) -> str:
    """Exercise 4's verdict from every engine's report (ordered by rank): compiled, the learning rate scaled by
    the number of workers, the ranks identical after the first step (rank 0's start broadcast) and after every
    later one (the gradients averaged)."""
    if all(r.get("unanswered") for r in reports):
        return "exercise 4: not answered yet"
    for r in reports:
        if r.get("unanswered"):
            return f"exercise 4: rank {r['rank']} still raises NotImplementedError: every rank runs the same code"
        if "error" in r:
            return f"exercise 4: rank {r['rank']} raised {r['error']}"
        if not r["compiled"]:
            return f"exercise 4: wrong: rank {r['rank']}'s model is not compiled: compile it with your optimizer"
    for r in reports[1:]:
        if r["kinds"] != reports[0]["kinds"]:
            return (f"exercise 4: wrong: rank {r['rank']} returned other callbacks than rank 0: every rank must take "
                    "part in the same collectives (not trained, so that no rank waits forever)")
    for r in reports:
        if abs(r["lr"] - base_lr * r["size"]) > 1e-6 * base_lr * r["size"]:
            return "exercise 4: wrong: the learning rate is not scaled by the number of workers (step 3)"
    for step in range(len(reports[0]["digests"])):
        for r in reports[1:]:
            if r["digests"][step] != reports[0]["digests"][step]:
                if step == 0:
                    return (f"exercise 4: wrong: rank {r['rank']} did not start from rank 0's weights: the broadcast "
                            "is missing (step 5)")
                return (f"exercise 4: wrong: rank {r['rank']}'s weights differ from rank 0's after step {step + 1}: "
                        "the gradients are not averaged across the ranks (step 4)")
    return f"exercise 4: correct: the same weights on all {len(reports)} ranks after every step, the rate scaled"


def check_exercise_4(cluster, fn, wait: float = 120.0) -> str:
    """Grade exercise 4 on the engines of `cluster`: `fn(model, base_lr)` compiles the model for Horovod and returns
    the callbacks fit needs. A run that hangs is named, and the engines are restarted."""
    if not callable(fn):
        raise TypeError(f"check_exercise_4: pass your function (horovodize), not {type(fn).__name__}")
    from ipyparallel.error import TimeoutError as NoReply
    try:
        reports = cluster.wait(cluster.view.apply_async(_run_horovodize, fn), timeout=wait)
    except NoReply:
        cluster.restart()
        return (f"exercise 4: wrong: no rank finished in {wait:.0f} s, the ranks wait in a collective some rank never "
                "calls; the engines were restarted (their variables are gone)")
    return judge_4(sorted(reports, key=lambda r: r["rank"]))
