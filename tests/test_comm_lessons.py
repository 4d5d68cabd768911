"""kit.comm.lessons and kit.comm.appendix_notes: notebooks 02 and 03's (and appendices 02a and 03a's) lessons as
kit.checks values, each made to hold and to fail here, and a failing one says why from its numbers."""
import numpy as np

from kit import checks
from kit.comm import appendix_notes, costmodel, lab_latency, lessons, staleness


def rows(seconds, model):
    return {n: {"seconds": s, "model_s": m} for n, s, m in zip((2, 3, 4), seconds, model)}


def test_equal_and_bytes_checks_name_what_differed():
    assert lessons.equal_check("correct", {"a": True, "b": True}, "numpy").held
    bad = lessons.equal_check("correct", {"a": True, "rank 1, float16": False}, "numpy")
    assert not bad.held and "rank 1, float16" in bad.reason and "1 of 2" in bad.measured
    assert not lessons.equal_check("correct", {}, "numpy").held          # nothing compared is not a pass
    assert lessons.bytes_check("bytes", [100, 101], 100, 4, "2(N−1)/N·K").held
    off = lessons.bytes_check("bytes", [100, 140], 100, 4, "2(N−1)/N·K")
    assert not off.held and "+40" in off.reason


def test_growth_holds_within_the_tolerance_and_fails_outside_it():
    assert lessons.growth_check("one server", rows((1.0, 1.5, 2.1), (1.0, 1.5, 2.0)), 2, 4).held     # 2.1x vs 2.0x
    bad = lessons.growth_check("the ring", rows((0.5, 0.9, 1.2), (0.5, 0.6, 0.75)), 2, 4)            # 2.4x vs 1.5x
    assert not bad.held and "measured/model was 1.00 at N = 2 and 1.60 at N = 4" in bad.reason
    assert "did not hold" in checks.markdown([bad])


def test_the_ring_losing_small_messages_and_the_straggler_can_each_fail():
    ring, server = rows((2e-3, 3e-3, 5e-3), (1, 1, 1)), rows((3e-3, 3.2e-3, 3.5e-3), (1, 1, 1))
    lost = lessons.small_k_check(ring, server, 4096, 800e-6, 300e-6)
    assert lost.held and "slower at N = 4)" in lost.measured
    won = lessons.small_k_check(server, ring, 4096, 100e-6, 300e-6)
    assert not won.held and "100 µs" in won.reason
    assert lessons.straggler_check(20.5, 1.0, 20, 1.3).held
    assert "did not wait" in lessons.straggler_check(2.0, 1.0, 20, 1.3).reason
    assert "share the cores" in lessons.straggler_check(20.0, 15.0, 20, 1.3).reason


def test_the_straggler_as_section_5_shows_it_says_what_each_server_does():
    held = lessons.straggler_demo_check(0, 20, 19.9, -0.6)
    text = checks.markdown([held])
    assert held.held and "+19.9 ms" in text and "-0.6 ms" in text and "Worker 0 slept 20 ms" in text
    bad = checks.markdown([lessons.straggler_demo_check(0, 20, 2.0, -0.6)])
    assert "did not hold" in bad and "did not wait for it" in bad
    assert lessons.straggler_check(20.5, 1.0, 20).detail == ""            # no staleness given: no detail
    assert "mean staleness 1.30" in lessons.straggler_check(20.5, 1.0, 20, 1.3).detail


def test_the_accuracy_note_gives_every_number():
    text = lessons.accuracy_note({"sync": 0.697, "async": 0.737, "async + straggler": 0.7371}, 100, 120, 0.1, 300)
    for s in ("sync 69.7%", "async 73.7%", "applied 100 updates", "batch of 120 at LR = 0.1", "applied 300 updates",
              "40 samples at LR/3"):
        assert s in text, s


def lab_rows(seconds, model, tx=None, rx=None, model_bytes=None, ns=(2, 3, 4)):
    """{N: row} of one implementation, as kit.plots.network.rows gives them."""
    return {n: {"seconds": s, "model_s": m, "tx": [t] * n, "rx": [r] * n, "model_bytes": model_bytes or 1}
            for n, s, m, t, r in zip(ns, seconds, model, tx or (0,) * len(ns), rx or (0,) * len(ns))}


def test_notebook_02s_lab_paragraphs_give_the_runs_numbers():
    K = 64 << 20
    assert "α = 157 µs (median of 5 ping-pong rounds; they ranged 79–1030 µs), B = 121 MB/s over 1gbit" in \
        lessons.link_note(157e-6, 121e6, {"alpha_range": [79e-6, 1030e-6], "rounds": 5}, "1gbit")
    assert "median of 1 ping-pong rounds; they ranged 157–157 µs" in lessons.link_note(157e-6, 121e6, {}, "1gbit")
    assert "bare sockets" not in lessons.link_note(157e-6, 121e6, {}, "1gbit")          # an older run's JSON
    parts = lessons.link_note(157e-6, 121e6, {"alpha_range": [79e-6, 1030e-6], "rounds": 5, "socket_alpha": 5.2e-6,
                                              "socket_alpha_range": [4.9e-6, 6.1e-6]}, "1gbit")
    assert "bare sockets (a 4-byte echo between two plain processes, in the same rounds): 5 µs one way (5–6 over " \
           "the rounds), 3% of α. The rest is software" in parts
    assert "That part is what moved from round to round, while the link's own part held still" in parts
    wide = {"alpha_range": [79e-6, 300e-6], "socket_alpha": 5e-6, "socket_alpha_range": [5e-6, 200e-6]}
    assert "the link's own part moved about as much as α did" in lab_latency.alpha_parts(157e-6, wide)
    slow = {"socket_alpha": 200e-6, "socket_alpha_range": [190e-6, 210e-6]}
    assert "On this run the link's own latency is all of α." in lab_latency.alpha_parts(157e-6, slow)
    ps = lab_rows((2.276, 3.4, 4.571), (2.2, 3.3, 4.4), tx=(0, 0, 4.008 * K), rx=(0, 0, 4.012 * K))
    byteps = lab_rows((0.577, 0.7, 0.893), (0.56, 0.7, 0.84), tx=(0, 0, 1.002e6), model_bytes=1e6)
    ring = lab_rows((0.569, 0.7, 0.854), (0.56, 0.7, 0.84))
    text = lessons.bandwidth_note(K, ps, byteps, ring)
    for s in ("K = 64 MB", "2276 ms per step at N = 2", "4571 ms at N = 4, 2.01× (the model: 2.00×; measured/model "
              "1.03 and 1.04)", "sent 1.002× and received 1.003× N·K", "sent 1.002× 2(N−1)/N·K",
              "577 ms → 893 ms (1.55×, model 1.50×)", "569 ms → 854 ms (1.50×, model 1.50×)",
              "at N = 4 the two were level within 5% (ring 854 ms, servers on the workers 893 ms)"):   # 1.046×
        assert s in text, s
    apart = lab_rows((0.569, 0.7, 0.754), (0.56, 0.7, 0.84))
    apart[4]["range"] = [0.750, 0.760]
    assert "at N = 4 the ring was faster (ring 754 ms (750–760 over its calls), servers on the workers 893 ms)" in \
        lessons.bandwidth_note(K, ps, byteps, apart)
    assert "the servers on the workers were faster (ring 893 ms" in lessons.bandwidth_note(K, ps, apart, byteps)
    assert "equalled the ring (within 5%) or beat it at N = 2, 3, 4." in text
    slow = lab_rows((0.7, 0.9, 1.1), (0.56, 0.7, 0.84), tx=(0, 0, 1.002e6), model_bytes=1e6)
    assert "more than 5% slower than the ring at every N." in lessons.bandwidth_note(K, ps, slow, ring)
    assert "this lab does not run that arrangement" in text


def test_notebook_02s_small_message_table_and_paragraph():
    ps, byteps, ring = lab_rows((8.1e-4, 2.54e-3, 2.41e-3), (1, 1, 1)), lab_rows((1.28e-3, 4e-3, 5e-3), (1, 1, 1)), \
        lab_rows((2.45e-3, 4.42e-3, 8.64e-3), (1, 1, 1))
    table = lessons.latency_table(4096, 30, ps, byteps, ring, {"2": 1225e-6, "3": 1105e-6, "4": 1441e-6})  # from JSON
    assert "K = 4 KB: latency.** Median ms per step (30 calls each)" in table
    assert "| 2 | 0.81 | 1.28 | 2.45 | 1225 |" in table and "| 4 | 2.41 | 5.00 | 8.64 | 1441 |" in table
    assert ("The servers on the workers took 1.6–2.1× one server's step at N = 2, 3, 4, where the model puts them a "
            "little under it") in table
    assert "per such message they paid 640–1000 µs, the ring 1105–1441 µs. On these shared cores a step cost about " \
           "what its processes' messages cost, in sequence or not" in table
    fast = lab_latency.colocated_note(ps, ps, {2: 1225e-6, 3: 1105e-6, 4: 1441e-6})          # as fast as one server
    assert "took 1.0× one server's step at N = 2, 3, 4, where the model puts them a little under it (their bytes " \
           "are the ring's, their latency 2(α + (N−2)·o)): about one server's, as the model has it." in fast
    slow = lab_rows((1.2e-3, 2.4e-3, 3.6e-3), (1, 1, 1))                                   # 600 µs a message
    assert "Per message that is 0.5× the ring's (medians): less than the ring paid, so the count of messages alone " \
           "would make them slower still" in lab_latency.colocated_note(ps, slow, {2: 1225e-6, 3: 1105e-6, 4: 1441e-6})
    dear = lab_rows((4e-3, 8e-3, 12e-3), (1, 1, 1))                                         # 2 ms a message
    assert "Per message that is 1.6× the ring's (medians): more than the count of messages alone explains" in \
        lab_latency.colocated_note(ps, dear, {2: 1225e-6, 3: 1105e-6, 4: 1441e-6})
    slow = lessons.latency_note(304e-6, 157e-6, 304e-6, 1225e-6, [2, 3, 4], 4, 95 * 1024)
    for s in ("o = 304 µs, 1.9× α: each further worker cost the server more than the link's whole α",
              "1225 µs each (median over N), 8× the ping-pong's α",
              "slower one at N = 2, 3, 4.** That is the ring's weakness in kind",
              "(N−2)·α > (N−1)·o: at none of these N",
              "(N−2)·α > (N−1)·o: at none of these N. In the model, the ring loses", "1225 against 304 µs",
              "K* = 95 KB for N = 4"):
        assert s in slow, s
    fast = lessons.latency_note(-5e-6, 157e-6, 0.0, 200e-6, [], 4, 0)
    assert "o = -5 µs, 0.0× α: its N messages' latencies overlap" in fast and "not the slower one at any N" in fast


def test_notebook_02s_extrapolation_gives_the_models_numbers():
    ns = np.array([8, 16, 64, 512])
    K, a, B, o = 25.6e6 * 4, 157e-6, 25e9 / 8, 304e-6
    t_one = costmodel.t_comm_ps(ns, K, a, B, 1, o)
    share = {64: 0.37, 512: 0.38}
    text = lessons.extrapolation_note(ns, t_one, share, 0.25, o, K, a, B)
    for s in (f"N=8 communication takes {t_one[0]:.2f} s", f"{t_one[0] / 0.25:.1f}× the assumed 0.25 s",
              f"at N=512 it takes {t_one[-1]:.0f} s", f"{0.25 / (0.25 + t_one[-1]):.2%} efficiency",
              "37% of the time at N = 64 and 38% at N = 512", "o = 304 µs",
              f"no o, as on a cluster where a message waits for the link rather than for a core, the ring "
              f"{costmodel.t_comm_ring(512, K, a, B):.2f} s ({costmodel.latency_share('ring', 512, K, a, B):.0%} of "
              f"it latency) against {costmodel.t_comm_ps(512, K, a, B, 64):.2f} s for k = 64 servers: the ring wins"):
        assert s in text, s
    assert "Charged as this lab paid" not in text                  # no ring cost of its own: the link's α alone
    lab = lessons.extrapolation_note(ns, t_one, share, 0.25, o, K, a, B, 920e-6)   # both sides as the lab paid
    ring_lab, k64_lab = costmodel.t_comm_ring(512, K, 920e-6, B), costmodel.t_comm_ps(512, K, a, B, 64, o)
    assert ring_lab > k64_lab
    assert (f"Charged as this lab paid each message (the ring 920 µs per message in sequence, the servers α and o as "
            f"above), at N = 512 the ring {ring_lab:.2f} s") in lab
    assert f"against {k64_lab:.2f} s for k = 64 servers: the ring loses. Charged the link's α (157 µs)" in lab
    o_part, wire = 2 * 511 * o, costmodel.t_comm_ps(512, K, 0, B, 1, 0)
    assert f"at N = 512 it is {o_part:.2f} s, the bytes {wire:.2f} s: the bytes, not o, make" in text
    slow_o = lessons.extrapolation_note(ns, costmodel.t_comm_ps(ns, 4096, a, B, 1, o), share, 0.25, o, 4096, a, B)
    assert "o, more than the bytes, make the server collapse" in slow_o       # small K: o dominates


def test_the_kits_ring_beats_the_plain_ring_or_says_why_not():
    held = lessons.kit_ring_check(47.0, 32.2, 3, 2)
    assert held.held and "the kit's ring is 1.46× as fast" in held.measured and "fewer copies" in held.detail
    for plain, verdict in ((22.0, "the plain ring is 1.46× as fast"), (33.0, "about the same")):
        text = checks.markdown([lessons.kit_ring_check(plain, 32.2, 3, 2)])
        assert "did not hold" in text and verdict in text and "3 engines on 2 cores left none free" in text
        assert "fewer copies" not in text


def test_notebook_03s_lab_paragraphs_give_the_runs_numbers():
    ring = lab_rows((0.569, 0.7, 0.853), (0.552, 0.7, 0.828), tx=(0, 0, 1.003e6), model_bytes=1e6)
    ps = lab_rows((2.273, 3.4, 4.553), (2.2, 3.3, 4.4))
    for r in (*ring.values(), *ps.values()):
        r["range"] = [r["seconds"] - 0.002, r["seconds"] + 0.001]
    link = {"alpha_range": [44e-6, 570e-6], "rounds": 5}
    args = (64 << 20, ring, ps, 121e-6, 121e6, link, "1gbit", {"kit ring": 0.94, "Horovod (Gloo)": 0.71})
    text = lessons.ring_lab_note(*args, reps=3, ranges=True)
    for s in ("The links: 1gbit (ping-pong: α = 121 µs, median of 5 rounds that ranged 44–570 µs; B = 121 MB/s",
              "K = 64 MB", "569 ms (567–570 over 3 calls) at N = 2", "853 ms (851–854 over 3 calls) at N = 4",
              "1.50× (the model: 1.50×; its bandwidth term 2(N−1)/N alone: 1.50×)", "2273 ms (2271–2274 over 3 calls)",
              "2.00× (model 2.00×)", "ring 1.03, 1.03; PS 1.03, 1.03", "sent 1.003× the model's",
              "kit ring 94%, Horovod (Gloo) 71%."):
        assert s in text, s
    assert "over 3 calls" not in lessons.ring_lab_note(*args, reps=3, ranges=False)     # the committed JSON
    link.update(socket_alpha=6e-6, socket_alpha_range=[5e-6, 7e-6])
    assert "same for every N). The same two hosts with bare sockets" in lessons.ring_lab_note(*args, reps=3,
                                                                                              ranges=True)
    small = lessons.ring_latency_note(4096, 30, lab_rows((2.27e-3, 4.2e-3, 7.87e-3), (1, 1, 1)),
                                      lab_rows((8e-4, 2.23e-3, 1.62e-3), (1, 1, 1)), 121e-6, 213e-6, 1135e-6,
                                      [2, 3, 4], 4, 121e6)
    for s in ("At K = 4 KB latency decides (30 calls per point", "N = 2: ring 2.27 ms, one server 0.80 ms",
              "**The ring was the slower one at N = 2, 3, 4.**",
              "cost 1135, 1050, 1312 µs each at N = 2, 3, 4 (median 1135 µs, 9× the ping-pong's α",
              "o = 213 µs per further worker",
              "K* = " + costmodel.human(costmodel.crossover_bytes(4, 121e-6, 121e6, 213e-6, alpha_ring=1135e-6))
              + " for N = 4.",
              "more than the link's whole α (121 µs): a serial per-message cost, not the link's latency"):
        assert s in small, s
    assert "Gloo's own ring" not in small                          # not run: not said
    gloo = lessons.ring_latency_note(4096, 30, lab_rows((2.27e-3, 4.2e-3, 7.87e-3), (1, 1, 1)),
                                     lab_rows((8e-4, 2.23e-3, 1.62e-3), (1, 1, 1)), 121e-6, 213e-6, 1135e-6,
                                     [2, 3, 4], 4, 121e6, gloo=lab_rows((7e-4, 2.5e-3, 4.86e-3), (1, 1, 1)))
    assert "C++, no Python per step) at the same points: N = 2: 0.70 ms, N = 3: 2.50 ms, N = 4: 4.86 ms; slower " \
           "than one server at N = 3, 4: the loss is the ring's, not only the kit's Python ring's." in gloo
    tie = lessons.ring_latency_note(4096, 30, lab_rows((2.27e-3, 4.2e-3, 7.87e-3), (1, 1, 1)),
                                    lab_rows((8e-4, 2.23e-3, 1.62e-3), (1, 1, 1)), 121e-6, 213e-6, 1135e-6,
                                    [2, 3, 4], 4, 121e6, gloo=lab_rows((7e-4, 2e-3, 1.5e-3), (1, 1, 1)))
    assert "slower than one server at none of them: this loss is the kit's Python ring's per-step cost" in tie
    overlapped = lessons.ring_latency_note(4096, 30, ps, ring, 1e-4, 0, 1e-4, [], 4, 121e6)
    assert "not the slower one at any N" in overlapped and "serial per-message cost" not in overlapped
    assert "(N−1)·o: at N = 8. What this run measured is that each of the ring's messages in sequence cost 10× " \
           "the ping-pong's α and 20.0× the server's o" in lab_latency.ring_loss([8], 100e-6, 50e-6, 1e-3)   # 6α > 7o
    assert "10× the ping-pong's α: a ring step" in lab_latency.ring_loss([8], 100e-6, 0.0, 1e-3)   # no o fitted
    assert "less than the link's α (100 µs): the further messages' latencies overlapped" in overlapped


def test_notebook_03s_closing_paragraph_gives_the_models_numbers():
    a, B, K = 74e-6, 2.9e9, 16 << 20
    text = lessons.at_scale_note(3, 47.0, 32.2, a, B, K)
    assert "Charged the lab's o" not in text
    assert "(section 6: the server o = 389 µs per further worker, the ring 74 µs per message in sequence; the lab's " \
           "α = 74 µs and B = 2900 MB/s), at N = 1024 the ring never loses." in \
        lessons.at_scale_note(3, 47.0, 32.2, a, B, K, o=389e-6)                        # α and B of this box
    k_lab = costmodel.human(costmodel.crossover_bytes(1024, 150e-6, 121e6, 389e-6, alpha_ring=1473e-6))
    assert (f"the ring 1473 µs per message in sequence; the lab's α = 150 µs and B = 121 MB/s), at N = 1024 the ring "
            f"loses below {k_lab}.") in lessons.at_scale_note(3, 47.0, 32.2, a, B, K, o=389e-6, a_ring=1473e-6,
                                                              lab_alpha=150e-6, lab_B=121e6)
    for s in ("16 MB on 3 engines: the plain ring 47.0 ms, the kit's ring 32.2 ms", "α = 74 µs and B = 2.90 GB/s",
              f"ring {costmodel.t_comm_ring(1024, K, a, B):.2f} s "
              f"({costmodel.latency_share('ring', 1024, K, a, B):.0%} of it its 2(N−1) latencies) against "
              f"{costmodel.t_comm_ps(1024, K, a, B):.1f} s",
              f"at 4 KB the ring {costmodel.t_comm_ring(1024, 4096, a, B) * 1e3:.0f} ms",
              f"lose below {costmodel.human(costmodel.crossover_bytes(1024, a, B))}."):
        assert s in text, s


def test_appendix_02as_mlp_note_sets_the_exchanges_against_the_empty_ones_and_k_over_b():
    rows = [dict(N=1, k=1, K=200_000, measured_ms=0.8, empty_ms=0.7, error=-0.58),
            dict(N=4, k=1, K=200_000, measured_ms=4.5, empty_ms=1.14, error=0.77)]
    text = appendix_notes.mlp_note(rows, [0.7, 1.14, 2.03], 2.0e9)
    for s in ("took 0.70 to 2.03 ms", "took 0.8 to 4.5 ms: 1.1× to 3.9× the empty exchange", "0.10 ms of bandwidth",
              "missed them by -58% to +77%"):
        assert s in text, (s, text)


def test_appendix_02as_fit_line_counts_each_models_exchanges_within_25_percent():
    ab = dict(alpha=92e-6, B=2.66e9, B_max={1: 2.37e9, 2: 3.13e9})
    text = appendix_notes.exchange_fit_line(ab, np.array([0.05, -0.3, 0.1]), np.array([0.2, 0.1, 0.4]))
    for s in ("alpha = 92 us, B = 2.66 GB/s, B_max = 2.37 / 3.13 GB/s", "3 exchanges:",
              "within 25% for 2/3 (median |error| 10%)", "2 alpha + 2NK/B: 2/3 (median |error| 20%)"):
        assert s in text, (s, text)


def test_appendix_02as_refined_model_holds_for_two_thirds_and_says_why_not_otherwise():
    held = appendix_notes.refined_check(11, 14, 0.07, 0.15, 5, 10, 0.89)
    assert held.held and "11 of the 14 exchanges (median |error| 7% against the plain model's 15%)" in held.measured
    assert "did not hold" not in checks.markdown([held]) and "The refined model was the closer one" in held.detail
    assert appendix_notes.refined_check(10, 15, 0.07, 0.15, 5, 10, 0.89).held        # exactly 2/3
    neither = checks.markdown([appendix_notes.refined_check(6, 14, 0.10, 0.11, 5, 10, 0.89)])
    assert "did not hold" in neither and "neither model was clearly the closer one" in neither
    assert "nearer for the other 8" in neither and "fan test" not in neither
    plain = checks.markdown([appendix_notes.refined_check(3, 14, 0.20, 0.08, 7, 10, 0.89)])
    for s in ("did not hold", "because the plain model was the closer one, nearer for 11 of the 14",
              "share B_max, 0.89× one stream's B", "7 of the 10 exchanges with N ≥ 2 took longer", "The fan test"):
        assert s in plain, (s, plain)


def test_appendix_03as_gap_note_and_summary_give_the_runs_numbers():
    K = 16 << 20
    text = appendix_notes.ring_gap_note(K, 138e-6, 2.69e9, 22.3e-3, 6.5e-3, 705e-6, 0.86e9)
    for s in ("At N = 2 and 16 MB", "predicts 6.5 ms; the ring took 22.3 ms on a fresh cluster, 3.4× the model",
              "fits B = 0.86 GB/s, 32% of the ping-pong's", "α = 705 µs is 5× the ping-pong's 138 µs"):
        assert s in text, (s, text)
    at = {"kit ring": 0.84, "Horovod (Gloo)": 0.5, "Horovod (MPI)": 0.92, "torch.distributed (gloo)": 0.89}
    summary = appendix_notes.one_host_summary(64 << 20, at, 100, dict(one_by_one=0.311, fused=0.009), K, 2, 4,
                                              2.75, 1.56, 3.4)
    for s in ("At 64 MB, N = 2: kit ring busbw 0.84 GB/s, Horovod 0.50 (Gloo) / 0.92 (MPI) GB/s, torch.distributed "
              "0.89 GB/s.", "100 tensors of 4 KB: one by one 311 ms, fused 9.0 ms",
              "grew 175% from N = 2 to 4 at 16 MB, the model 56%, and at N = 2 it was 3.4× the model"):
        assert s in summary, (s, summary)


def test_appendix_03as_own_line_check_fails_outside_its_band_and_names_a_run_to_run_difference():
    K = 16 << 20
    fits = appendix_notes.own_line_check(K, 22.3e-3, 6.5e-3, 21.0e-3, 19.9e-3)
    text = checks.markdown([fits])
    assert fits.held and "22.3 ms, 1.1× the 21.0 ms" in text and "the ping-pong's (3.4×) does not" in text
    assert "the same call at the same size took 19.9 ms" in text and "run-to-run" not in text
    apart = checks.markdown([appendix_notes.own_line_check(K, 32.3e-3, 6.5e-3, 21.0e-3, 19.9e-3)])
    for s in ("did not hold", "1.5× the 21.0 ms", "because even the ring's own straight line misses its 16 MB call",
              "1.6× the sweep's, a run-to-run difference on this shared machine"):
        assert s in apart, (s, apart)
    line = checks.markdown([appendix_notes.own_line_check(K, 32.3e-3, 6.5e-3, 21.0e-3, None)])
    assert "did not hold" in line and "misses its 16 MB call." in line and "sweep's" not in line


def test_appendix_03as_growth_check_holds_when_the_ring_grew_more_than_the_model():
    held = appendix_notes.ring_growth_check(16 << 20, 2, 4, 2.75, 1.56, 3.4)
    assert held.held and "grew by 175%" in held.measured and "model's 56%" in held.bound
    text = checks.markdown([appendix_notes.ring_growth_check(16 << 20, 2, 4, 1.3, 1.56, 3.4)])
    for s in ("did not hold", "grew by 30% (bound: more than the model's 56%)",
              "because it grew less than the model in this run, but from an N = 2 point already 3.4× the model"):
        assert s in text, (s, text)


def test_appendix_03as_fusion_off_note_weighs_this_run_against_the_benchmark():
    run = {"Horovod (Gloo)": {"one_by_one": 0.506}, "Horovod (Gloo), fusion off": {"one_by_one": 0.160}}
    bench = {"Horovod (Gloo)": {"one_by_one": 0.128}, "Horovod (Gloo), fusion off": {"one_by_one": 0.232}}
    text = appendix_notes.fusion_off_note(run, bench, 100)
    assert "5.06 ms per tensor with fusion on, 1.60 ms with it off (0.32×)" in text
    assert "measured 1.28 and 2.32 ms (1.81×). The two runs disagree, so they do not settle" in text
    bench["Horovod (Gloo), fusion off"]["one_by_one"] = 0.1
    assert "fusion off was the faster one tensor at a time in both runs; this appendix does not measure why." in \
        appendix_notes.fusion_off_note(run, bench, 100)
    run["Horovod (Gloo), fusion off"]["one_by_one"], bench["Horovod (Gloo), fusion off"]["one_by_one"] = 0.7, 0.3
    assert "fusion off was the slower one tensor at a time in both runs" in appendix_notes.fusion_off_note(run, bench,
                                                                                                         100)
    run["Horovod (Gloo), fusion off"]["one_by_one"], bench["Horovod (Gloo), fusion off"]["one_by_one"] = 0.52, 0.13
    assert "(1.02×): about the same in both runs." in appendix_notes.fusion_off_note(run, bench, 100)
    assert "benchmark" not in appendix_notes.fusion_off_note(run, None, 100)
    assert set(appendix_notes.committed_fusion()) >= set(run)               # the committed results/allreduce.json


def test_the_straggler_note_reads_why_the_mean_staleness_fell_from_the_records():

    who = np.array([1, 2] * 100)
    who[::15] = 0                                                 # the straggler, now and then
    who = np.concatenate([who, [0] * 20])                         # and alone at the end
    s = np.where(who == 0, 5.0, 1.0)
    s[-20:] = 0.0
    text = staleness.straggler_note(np.full(300, 1.92), s, who, 0)
    for part in ("Mean staleness: 1.92 without the straggler, 1.16 with it (it fell)",
                 "The fast workers' last update was update 200 of 220; the straggler's last 20 updates",
                 "Before that point the mean was 1.28, still under the 1.92 without it: the fast workers' 186 updates "
                 "averaged 1.00, near the 1 other fast worker", "The straggler's own 14 averaged 5.00",
                 "but they were 7% of the updates before that point."):
        assert part in text, part
    higher = staleness.straggler_note(np.full(300, 1.0), s, who, 0)                     # 1.16 overall: it rose
    assert "(it did not fall in this run)" in higher and "higher than without the straggler too." in higher
    assert "the mean fell only because" in staleness.straggler_note(np.full(300, 1.2), s, who, 0)
    assert "did not push last" in staleness.straggler_note(np.full(300, 1.0), s[:200], who[:200], 0)
