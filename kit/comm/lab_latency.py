"""The lab's small messages, read with care (notebooks 02 and 03, `python -m kit.bench network`'s page): what of
the ping-pong's α is the link's, why the servers on the workers ran slower than the model, and where the ring was
slower than one server, against what the model says with one α for every message.

    display(Markdown(lessons.link_note(alpha, B, link, rate)))     # ends with alpha_parts(alpha, link)
    ring_loss(loses, alpha, o, a_ring)                              # "The ring was the slower one at N = ..."
"""
from __future__ import annotations

import numpy as np

NEAR = (2 / 3, 1.5)     # a cost per message "about" another's: their ratio inside this band
STEADY = 0.5            # the link's own part "held still": its range under half the width of α's


def alpha_parts(alpha: float, link: dict) -> str:
    """Return the sentence that splits the ping-pong's α into the link's part (a bare socket's 4-byte one-way time on
    the same two hosts, measured in the same rounds: link["socket_alpha"]) and the rest, and which of the two moved
    over the rounds. "" for a run without the socket measure (older JSON)."""
    if "socket_alpha" not in link:
        return ""
    s, (lo, hi) = link["socket_alpha"], link["socket_alpha_range"]
    return (f" The same two hosts with bare sockets (a 4-byte echo between two plain processes, in the same rounds): "
            f"{s * 1e6:.0f} µs one way ({lo * 1e6:.0f}–{hi * 1e6:.0f} over the rounds), {s / alpha:.0%} of α."
            + alpha_reading(alpha, link))


def alpha_reading(alpha: float, link: dict) -> str:
    """Return what the bare socket's α (link["socket_alpha"], measured) says of the ping-pong's α: all of it the
    link's, or the rest software, and which part moved over the rounds."""
    s, (lo, hi), (a_lo, a_hi) = link["socket_alpha"], link["socket_alpha_range"], link.get("alpha_range", [alpha] * 2)
    if s >= alpha:
        return " On this run the link's own latency is all of α."
    return (" The rest is software: Gloo's and the engines' threads being woken and scheduled on this machine's "
                   "shared cores. " + (
                       "That part is what moved from round to round, while the link's own part held still: why α "
                       "differs between rounds, and between one notebook's run and another's on the same link."
                       if hi - lo < STEADY * (a_hi - a_lo) else
                       "Over these rounds the link's own part moved about as much as α did."))


def colocated_note(ps: dict[int, dict], byteps: dict[int, dict], ring_alpha: dict[int, float]) -> str:
    """Return the sentence on the servers on the workers at small K: their step against one server's, and per
    message each of their processes handles (2(N−1): N−1 shards pushed and served, N−1 pulled) against the ring's."""
    ns = sorted(n for n in byteps if n > 1 and n in ps and n in ring_alpha)
    if not ns:
        return ""
    times = [byteps[n]["seconds"] / ps[n]["seconds"] for n in ns]
    per = [byteps[n]["seconds"] / (2 * (n - 1)) * 1e6 for n in ns]
    ring = [ring_alpha[n] * 1e6 for n in ns]
    def rng(v, f):              # "2.0" where every N gave the same to the digits shown, else "1.9–2.1"
        lo, hi = f"{min(v):{f}}", f"{max(v):{f}}"
        return lo if lo == hi else f"{lo}–{hi}"
    said = (f"The servers on the workers took {rng(times, '.1f')}× one server's step at N = "
            f"{', '.join(map(str, ns))}, where the model puts them a "
            "little under it (their bytes are the ring's, their latency 2(α + (N−2)·o))")
    if max(times) < 1.1:
        return said + ": about one server's, as the model has it."
    ratio = float(np.median(per) / np.median(ring))
    return (said + ". Each of their processes sends and receives 2(N−1) messages a step, as a ring rank does; per such "
            f"message they paid {rng(per, '.0f')} µs, the ring {rng(ring, '.0f')} µs. "
            + ("On these shared cores a step cost about what its processes' messages cost, in sequence or not: "
               if NEAR[0] <= ratio <= NEAR[1] else
               f"Per message that is {ratio:.1f}× the ring's (medians): less than the ring paid, so the count of "
               "messages alone would make them slower still; " if ratio < NEAR[0] else
               f"Per message that is {ratio:.1f}× the ring's (medians): more than the count of messages alone "
               "explains; ")
            + "the model's o, fitted to one server whose workers send 2 messages each, does not carry over to "
              "processes that each handle 2(N−1).")


def ring_loss(loses: list[int], alpha: float, o: float, a_ring: float, said: bool = False) -> str:
    """Return the sentence on where the ring was slower than one server at small K, read with care: `a_ring` is the
    ring's own time over its messages, so a model with it reproduces the loss by construction; with the ping-pong's
    α for every message the model has the ring slower only where (N−2)·α > (N−1)·o. `said`: the paragraph already
    gives a_ring against α (then the closing sentence on what the run measured is left out)."""
    if not loses:
        return "The ring was not the slower one at any N of this run."
    by_alpha = [n for n in loses if (n - 2) * alpha > (n - 1) * o]
    out = (f"**The ring was the slower one at N = {', '.join(map(str, loses))}.** That is the ring's weakness in "
           "kind, latency paid message after message; but a model with the ring's own cost per message reproduces "
           "it by construction. With the ping-pong's α for every message, the model has the ring slower only where "
           "(N−2)·α > (N−1)·o: at " + (f"N = {', '.join(map(str, by_alpha))}" if by_alpha else "none of these N") + ".")
    if said:
        return out
    against_o = f" and {a_ring / o:.1f}× the server's o" if o > 0 else ""
    return out + (f" What this run measured is that each of the ring's messages in sequence cost {a_ring / alpha:.0f}× "
                  f"the ping-pong's α{against_o}: a ring step waits until N processes have been scheduled on the "
                  "shared cores, one message after another, while the server pays each further worker once.")
