"""Notebook 04's exercise checkers, written once for the notebook and its solutions: each says correct, wrong (and
which part) or not answered yet, never the answer.

    print(exercises.check_exercise_1(cluster.view, replicas_agree))   # on the engines: step 5 left out
    print(exercises.check_exercise_2(steps, images))                  # steps per rank, images in 12 epochs
    print(exercises.check_exercise_3(CKPT_DIR, epoch))                # the epoch resume() loads after a corruption
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
    return {"steps": steps, "averaged": hasattr(opt, "_allreduce"), "digest": weights_digest(broken)}


def _agrees(check, digests) -> bool | None:
    """Return the learner's check on `digests`, or None when it does not return a bool."""
    answer = check(list(digests))
    return answer if isinstance(answer, bool) else None


def grade_1(states: list, replicas_agree) -> str:
    """Grade exercise 1 from every rank's engine_state and the learner's check `replicas_agree(digests) -> bool`."""
    if any(s is None for s in states) or replicas_agree is None:
        return "exercise 1: not answered yet"
    if any(s["steps"] < 1 for s in states) or len({s["steps"] for s in states}) != 1:
        return "exercise 1: wrong: every rank must train `broken` for the same few steps (at least one)"
    if not all(s["averaged"] for s in states):
        return "exercise 1: wrong: only step 5 should be missing: `broken`'s optimizer must still average gradients"
    digests = [s["digest"] for s in states]
    if len(set(digests)) == 1:
        return ("exercise 1: wrong: the replicas ended identical, so something still made them equal: train "
                "without every step that copies rank 0's weights")
    n = len(digests)
    cases = [(digests, False), (["a"] * n, True), ([*["a"] * (n - 1), "b"], False), (["b", *["a"] * (n - 1)], False),
             (["a"], True), (["a", "b", "a"], False), (["a", "a", "a", "a"], True)]
    try:
        right = all(_agrees(replicas_agree, d) is want for d, want in cases)
    except Exception as e:          # the learner's check raised: say so, not the answer
        return f"exercise 1: wrong: your check raised {type(e).__name__}: {e}"
    return "exercise 1: correct" if right else \
        "exercise 1: the training is right, your check is wrong: it must return True or False, rightly, for any digests"


def check_exercise_1(view, replicas_agree) -> str:
    """Grade exercise 1 on the engines of `view`: each rank's `broken` model, and the learner's check."""
    import ipyparallel as ipp
    return grade_1(view.apply_sync(engine_state, ipp.Reference("broken")), replicas_agree)


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
        return f"exercise 3: not answered yet {said}"
    if found is None:
        return f"exercise 3: {'correct' if resume_epoch == 0 else 'wrong'} {said}"
    return f"exercise 3: {'correct' if resume_epoch == found['epoch'] else 'wrong'} {said}"
