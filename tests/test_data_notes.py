"""kit.data.lesson's checks for notebook 01 and appendix 01a: numbers in, kit.checks.Check out, each made to hold
and to fail."""
import math

import pytest

from kit import checks
from kit.data import lesson

FIT = dict(t_load=0.0568, t_load_cpu=0.0143, t_compute=0.0300, c_compute=0.0321, t_compute_alone=0.0322,
           t_handover=0.0018, cores=2)


def row(w, sps, step, predicted, spread=0.03, **extra):
    return dict(workers=w, samples_per_s=sps, step_ms=step, predicted_ms=predicted,
                model_error=abs(predicted - step) / step, step_spread=spread, **extra)


def test_the_model_rows_name_the_side_that_set_the_pace_and_hold_within_the_tolerance():
    rows = [row(0, 718, 89.0, 89.0), row(1, 1107, 57.8, 56.8), row(2, 1971, 32.4, 31.8), row(4, 1871, 34.2, 31.8)]
    one, four = lesson.model_checks(rows, FIT, (0, 2))
    assert one.name == "model, W=1 (loader sets the pace)" and one.held and one.measured == 57.8
    assert four.name == "model, W=4 (step sets the pace)" and four.held            # 7% < 10%
    assert four.bound == "31.8 ms ± 10%"


def test_a_model_row_beyond_both_the_tolerance_and_the_rounds_spread_fails():
    rows = [row(0, 718, 89.0, 89.0), row(1, 1107, 70.0, 56.8, spread=0.05), row(2, 1971, 32.4, 31.8),
            row(3, 1900, 40.0, 31.8, spread=0.30)]
    one, three = lesson.model_checks(rows, FIT, (0, 2))
    assert not one.held                                                             # 19% > max(10%, 5%)
    assert three.held and three.bound == "31.8 ms ± 30%"                            # 20% < the rounds' 30%


def test_the_cpu_pipeline_checks_hold_and_fail():
    fit = dict(t_load=0.11, t_load_cpu=0.11, c_compute=0.045, cores=2)              # floor (110 + 45) / 2 = 77.5 ms
    rows = [row(0, 412, 155.0, 155.0), row(2, 871, 76.0, 77.6), row(4, 1000, 78.0, 77.6)]
    gain, floor = lesson.cpu_checks(rows, fit)
    assert gain.held and gain.measured == pytest.approx(2.43, abs=0.01)
    assert floor.held and floor.name.endswith("(W=2) vs the cores' floor") and floor.bound == "≥ 73.6 ms"
    fast = [row(0, 412, 155.0, 155.0), row(4, 1080, 59.0, 77.6)]                   # 24% under the floor
    assert not lesson.cpu_checks(fast, fit)[1].held
    stalled = [row(0, 412, 155.0, 155.0), row(2, 450, 140.0, 77.6)]                 # 1.09x: the cores were busy
    assert not lesson.cpu_checks(stalled, fit)[0].held


def test_profile_loaders_advice_holds_within_twenty_percent():
    assert lesson.advice_check(0.0438, 0.0369).held                                 # -16%
    assert not lesson.advice_check(0.0438, 0.030).held                              # -32%
    assert "± 20%" in checks.table([lesson.advice_check(0.0438, 0.060)])


def test_a_spread_within_the_noise_band_is_a_tie_and_beyond_it_fails():
    tie = lesson.spread_check("prefetch_factor", [1786, 1844, 1897])                # 6%: no evidence of an order
    assert tie.held and tie.measured == pytest.approx(0.062, abs=0.001)
    assert not lesson.spread_check("prefetch_factor", [1500, 1844, 1897]).held       # 26%
    assert not lesson.spread_check("map(8) vs AUTOTUNE", [1100, 1386]).held


def test_a_buffer_on_the_serial_map_stays_under_its_pace():
    pre, four = dict(samples_per_s=691.0), dict(samples_per_s=753.0)
    held = lesson.prefetch_check([pre, four], load_ms=77.0, compute_ms=44.0, batch=64)   # 831 samples/s + 10%
    assert held.held and held.measured == 753 and held.bound == "≤ 914"
    assert not lesson.prefetch_check([dict(samples_per_s=1400.0)], 77.0, 44.0, 64).held


def test_the_trace_rows_compare_each_traced_share_with_the_sweep(monkeypatch):
    from kit import trace
    shares = {"a": 0.63, "b": 0.30}
    monkeypatch.setattr(trace, "data_wait", lambda t: {"wait_share": shares[t]})
    monkeypatch.setattr(trace, "spans", lambda t: [])
    rows = [dict(workers=0, busy=0.37), dict(workers=4, busy=0.92)]
    zero, four = lesson.trace_checks({0: {"trace": "a"}, 4: {"trace": "b"}}, rows)
    assert zero.held and zero.bound == "0.630 ± 0.1"
    assert not four.held and four.measured == 0.3                                    # 30% against 8%
    assert not math.isnan(zero.measured)
