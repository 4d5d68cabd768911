"""Notebook 02's asynchronous server, read from its records: why the mean staleness can fall with a straggler.

    display(Markdown(staleness.straggler_note(plain, s, who, STRAGGLER[0], STEPS)))

Staleness is the number of updates the server applied between a worker's pull and its push. With N workers at one
pace, about N − 1 others push in that time. A straggler pushes seldom, so while it runs each fast worker is
overtaken mostly by the other fast ones; and once the fast workers are done, the straggler pushes alone, overtaken
by nobody.
"""
from __future__ import annotations

import numpy as np


def straggler_note(plain, staleness, who, straggler: int) -> str:
    """Return the paragraph on the mean staleness without (`plain`: one run's staleness per update) and with a
    straggler (`staleness`, and `who` pushed each update): the stretch after the fast workers' last update, and before
    it each kind of worker's mean against the run without the straggler."""
    plain, s, who = np.asarray(plain, float), np.asarray(staleness, float), np.asarray(who)
    text = (f"Mean staleness: {plain.mean():.2f} without the straggler, {s.mean():.2f} with it"
            + (" (it fell)" if s.mean() < plain.mean() else " (it did not fall in this run)")
            + f"; the straggler's own gradients averaged {s[who == straggler].mean():.2f}. ")
    fast = np.flatnonzero(who != straggler)
    if not len(fast) or fast.max() == len(s) - 1:
        last = who[-1]
        return text + (f"The straggler did not push last in this run (the last update came from worker {last}): no "
                       "stretch of updates without the others lowered the mean.")
    last_fast = int(fast.max())
    tail, before, by = s[last_fast + 1:], s[:last_fast + 1], who[:last_fast + 1]
    quick, slow = before[by != straggler], before[by == straggler]
    text += (f"The fast workers' last update was update {last_fast + 1} of {len(s)}; the straggler's "
             f"last {len(tail)} updates came after that, with nobody else updating in between, at staleness "
             f"{tail.mean():.2f} on average (the figure's last points). Before that point the mean was "
             f"{before.mean():.2f}")
    if before.mean() > plain.mean():
        return text + (", higher than without the straggler: the mean fell only because the run ends with the "
                       "straggler alone." if s.mean() < plain.mean() else ", higher than without the straggler too.")
    others = len(set(who.tolist())) - 2                     # the other fast workers, besides the one pushing
    why = (f", near the {others} other fast worker{'s' * (others != 1)} that can push between a fast worker's pull and "
           f"its push (without the straggler, {others + 1}): the straggler, pushing seldom, rarely overtook them"
           if abs(quick.mean() - others) <= 0.5 else "")
    own = (f"The straggler's own {len(slow)} averaged {slow.mean():.2f} (many updates passed while it computed), "
           f"but they were {len(slow) / len(before):.0%} of the updates before that point." if len(slow) else
           "The straggler's own had all come after that point.")
    return text + (f", still under the {plain.mean():.2f} without it: the fast workers' {len(quick)} updates averaged "
                   f"{quick.mean():.2f}{why}. {own}")
