"""kit.comm.lessons: notebooks 02 and 03's lessons as kit.checks values, each made to hold and to fail here, and a
failing one says why from its numbers."""
from kit import checks
from kit.comm import lessons


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
