"""kit.plan: each term of the model on synthetic inputs against a hand computation, and the bad descriptions."""
import math

import pytest

from kit.plan import Cluster, Link, Model, PlanError, Strategy, plan, predict, table

# a synthetic model: 1e6 float32 parameters, 4 layers, 1 ms per sample and layer, 1 kB of activations per sample
# and layer, 100 B between layers; SGD momentum (4 B per parameter): state 4 + 4 + 4 = 12 MB
M = Model(params=1_000_000, layers=4, act_bytes_per_sample_layer=1000, compute_s_per_sample_layer=1e-3,
          boundary_bytes_per_sample=100, tensors=8, backward_share=0.5, tp_allreduces_per_layer=4)
FAST = Link(alpha_s=1e-4, bandwidth_Bps=1e8)            # 100 µs, 100 MB/s
SLOW = Link(alpha_s=1e-3, bandwidth_Bps=1e7, overhead_s=2e-4)
C = Cluster(hosts=2, ranks_per_host=4, intra=FAST, inter=SLOW)


def run(kind, batch=16, cluster=C, **kw):
    return predict(M, cluster, Strategy(kind, **kw), batch)


def test_dp_ring_inside_a_host():
    r = run("dp", dp=4)
    # compute: 16/4 = 4 samples × 4 layers × 1 ms = 16 ms
    assert r["compute_s"] == pytest.approx(0.016)
    # ring over 4 ranks on FAST, 8 calls (tensors), K = 4 MB: 2·3·(8·1e-4 + 4e6/(4·1e8)) = 6·(0.0008 + 0.01) = 0.0648
    assert r["exposed_comm_s"] == pytest.approx(0.0648)
    assert r["step_s"] == pytest.approx(0.016 + 0.0648) and r["bubble_s"] == 0


def test_dp_across_hosts_uses_the_inter_link():
    r = run("dp", dp=8)
    # 8 ranks on 2 hosts of 4: SLOW. 2·7·(8·1e-3 + 4e6/(8·1e7)) = 14·(0.008 + 0.05) = 0.812; compute 2·4·1 ms = 8 ms
    assert r["exposed_comm_s"] == pytest.approx(0.812)
    assert r["compute_s"] == pytest.approx(0.008)


def test_overlap_hides_comm_behind_backward():
    r = run("dp_overlap", dp=4)
    # 0.0648 of comm, backward 0.5 × 16 ms = 8 ms hidden: 0.0568 (> the last call's 0.0648/8 = 0.0081)
    assert r["exposed_comm_s"] == pytest.approx(0.0648 - 0.008)
    slow = Model(**{**M.__dict__, "compute_s_per_sample_layer": 1.0})
    r = predict(slow, C, Strategy("dp_overlap", dp=4), 16)
    # backward 8 s hides all but the last call: 0.0648 / 8 = 0.0081
    assert r["exposed_comm_s"] == pytest.approx(0.0081)


def test_buckets_count_the_calls():
    r = run("dp_bucketed", dp=4, bucket_bytes=2e6)
    # K = 4 MB in 2 MB buckets: 2 calls; 2·3·(2·1e-4 + 0.01) = 0.0612; minus backward 8 ms = 0.0532 (> 0.0306)
    assert r["exposed_comm_s"] == pytest.approx(0.0612 - 0.008)


def test_ps_and_colocated_use_the_comm_formulas():
    # PS, 4 workers, 1 server on SLOW (the servers' own hosts): 2(α + 3 o) + 2·4·K/B = 2(1e-3 + 6e-4) + 8·4e6/1e7
    assert run("ps", dp=4)["exposed_comm_s"] == pytest.approx(0.0032 + 3.2)
    # co-located, 4 ranks inside a host (FAST, o = 0): 2(α + 2·0) + 2·3/4·4e6/1e8 = 2e-4 + 0.06
    assert run("ps_colocated", dp=4)["exposed_comm_s"] == pytest.approx(2e-4 + 0.06)


def test_zero_memory_and_comm():
    base = run("dp", dp=4)
    # params 4 MB, grads 4 MB, momentum 4 MB, activations 4 samples × 4 layers × 1 kB = 16 kB
    assert [base[k] for k in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")] == \
        [4e6, 4e6, 4e6, 16000]
    z1, z2, z3 = run("zero1", dp=4), run("zero2", dp=4), run("zero3", dp=4)
    assert z1["optimizer_bytes"] == 1e6 and z1["grads_bytes"] == 4e6            # optimizer /4
    assert z2["grads_bytes"] == 1e6 and z2["params_bytes"] == 4e6                # + grads /4
    assert z3["params_bytes"] == 1e6 and z3["memory_bytes_per_rank"] == 3e6 + 16000
    # ZeRO-1/2: one allreduce's steps and bytes: 2·3·(1e-4 + 0.01) = 0.0606
    assert z1["exposed_comm_s"] == pytest.approx(0.0606)
    # ZeRO-3: 1.5 × ring with one call per layer (4): 1.5·6·(4e-4 + 0.01) = 0.0936
    assert z3["exposed_comm_s"] == pytest.approx(0.0936)
    assert run("fsdp", dp=4)["exposed_comm_s"] == z3["exposed_comm_s"]


def test_tp_allreduces_and_activations():
    whole = Model(**{**M.__dict__, "tp_whole_bytes_per_sample_layer": 200})
    r = predict(whole, C, Strategy("tp", tp=4), 16)
    # compute 16 × 4 × 1 ms / 4 = 16 ms; 4 allreduces × 4 layers of 16 × 100 B over 4 ranks on FAST:
    # 16 · 2·3·(1e-4 + 1600/(4·1e8)) = 16 · 6 · 1.04e-4 = 0.009984
    assert r["compute_s"] == pytest.approx(0.016)
    assert r["exposed_comm_s"] == pytest.approx(0.009984)
    # activations: 16 samples × 4 layers × (200 whole + 800/4) = 25.6 kB; state /4: 3 MB
    assert r["activations_bytes"] == pytest.approx(25600)
    assert r["params_bytes"] == 1e6


def test_pp_bubble_p2p_and_schedules():
    r = run("pp", pp=4, microbatches=8, schedule="afab")
    # micro-batch 2 samples; slot = 2 × 1 layer × 1 ms = 2 ms; p2p inside a host: 1e-4 + 200/1e8 = 1.02e-4, two
    # per slot; step (m+p−1)(slot + 2 p2p) = 11 × 2.204 ms = 24.244 ms; bubble 3/11 of it = 6.612 ms
    assert r["compute_s"] == pytest.approx(0.016)
    assert r["step_s"] == pytest.approx(11 * 0.002204)
    assert r["bubble_s"] == pytest.approx(3 * 0.002204)
    assert r["exposed_comm_s"] == pytest.approx(8 * 2 * 1.02e-4)
    # activations: AFAB holds all 8 micro-batches (16 samples) × 1 layer × 1 kB; 1F1B holds min(8, 4) = 4 (8 samples)
    assert r["activations_bytes"] == 16000
    assert run("pp", pp=4, microbatches=8, schedule="1f1b")["activations_bytes"] == 8000


def test_combinations_place_groups_on_links():
    across = run("tp_pp", tp=2, pp=2, microbatches=2, placement="tp_across",
                 cluster=Cluster(hosts=2, ranks_per_host=2, intra=FAST, inter=SLOW))
    inside = run("tp_pp", tp=2, pp=2, microbatches=2,
                 cluster=Cluster(hosts=2, ranks_per_host=2, intra=FAST, inter=SLOW))
    # TP across: each TP pair spans the hosts, the 2 pairs share each host's NIC (1e7/2 B/s each): per micro-batch
    # slot 4 × 2 layers allreduces of 8 × 100 B: 8 · 2·(1e-3 + 800/(2·5e6)) = 0.01728, its sends inside (FAST)
    # 2 × (1e-4 + 800/1e8); inside: TP 8 · 2·(1e-4 + 800/2e8) = 0.001664, its sends on the shared NIC
    # 2 × (1e-3 + 800/5e6) = 0.00232; two slots (m = 2) each
    assert across["exposed_comm_s"] == pytest.approx(2 * (0.01728 + 2 * (1e-4 + 8e-6)))
    assert inside["exposed_comm_s"] == pytest.approx(2 * (0.001664 + 0.00232))
    dp_pp = run("dp_pp", dp=2, pp=2, microbatches=2)
    # dp across hosts (stride tp·pp = 2 on hosts of 4: inside one host here): gradients 2 MB per stage:
    # 2·1·(8·1e-4 + 2e6/(2·1e8)) = 0.0216
    assert dp_pp["exposed_comm_s"] == pytest.approx(0.0216 + 2 * 2 * (1e-4 + 400 / 1e8))


def test_fits_and_plan_table():
    small = Cluster(hosts=2, ranks_per_host=4, intra=FAST, inter=SLOW, device_memory_bytes=5e6)
    rows = plan(M, small, 64)
    fits = {r["kind"]: r["fits"] for r in rows}
    assert fits["dp"] is False and fits["zero3"] is True          # 12 MB + activations > 5 MB > 1.5 MB + ...
    assert [r["step_s"] for r in rows] == sorted(r["step_s"] for r in rows)
    assert "tp" not in fits                                       # 8 ranks, TP only inside one host: not offered
    text = table(rows)
    assert len(text.splitlines()) == len(rows) + 1 and "step_s" in text.splitlines()[0]


BAD = [
    (lambda: Model(params=-1, layers=4, act_bytes_per_sample_layer=1, compute_s_per_sample_layer=1), "Model.params"),
    (lambda: Model(params=10, layers=0, act_bytes_per_sample_layer=1, compute_s_per_sample_layer=1), "Model.layers"),
    (lambda: Model(params=10, layers=2, act_bytes_per_sample_layer=-5, compute_s_per_sample_layer=1),
     "Model.act_bytes_per_sample_layer"),
    (lambda: Model(params=10, layers=2, act_bytes_per_sample_layer=1, compute_s_per_sample_layer=math.nan),
     "Model.compute_s_per_sample_layer"),
    (lambda: Model(params=10, layers=2, act_bytes_per_sample_layer=1, compute_s_per_sample_layer=1,
                   tp_whole_bytes_per_sample_layer=2), "Model.tp_whole_bytes_per_sample_layer"),
    (lambda: Link(alpha_s=-1e-6, bandwidth_Bps=1e9), "Link.alpha_s"),
    (lambda: Link(alpha_s=1e-6, bandwidth_Bps=0), "Link.bandwidth_Bps"),
    (lambda: Cluster(hosts=0, ranks_per_host=4, intra=FAST), "Cluster.hosts"),
    (lambda: Cluster(hosts=1, ranks_per_host=2.5, intra=FAST), "Cluster.ranks_per_host"),
    (lambda: Cluster(hosts=1, ranks_per_host=2, intra="fast"), "Cluster.intra"),
    (lambda: Cluster(hosts=1, ranks_per_host=2, intra=FAST, device_memory_bytes=0), "Cluster.device_memory_bytes"),
    (lambda: Strategy("hybrid"), "Strategy.kind"),
    (lambda: Strategy("dp", dp=0), "Strategy.dp"),
    (lambda: Strategy("pp", pp=2, schedule="zigzag"), "Strategy.schedule"),
    (lambda: Strategy("dp", dp=2, tp=2), "Strategy.tp"),
    (lambda: Strategy("dp", dp=2, microbatches=4), "Strategy.microbatches"),
    (lambda: run("dp", dp=16), "Strategy.dp·tp·pp"),
    (lambda: run("tp", tp=8), "Strategy.tp"),
    (lambda: run("pp", pp=6, microbatches=6, cluster=Cluster(hosts=2, ranks_per_host=4, intra=FAST)),
     "Strategy.pp"),
    (lambda: run("pp", pp=4, microbatches=8, batch=4), "predict.global_batch"),
    (lambda: run("dp", dp=4, batch=-1), "predict.global_batch"),
]


@pytest.mark.parametrize("make, field", BAD, ids=[f for _, f in BAD])
def test_bad_descriptions_name_the_field(make, field):
    with pytest.raises(PlanError) as e:
        make()
    assert str(e.value).startswith(field + " = ")


def test_published_target_can_fail():
    from kit.plan.published import cases, within
    assert within(93.7, 90) and not within(84.5, 68) and not within(50, 76)
    rows = cases()
    assert all(math.isfinite(r["predicted"]) for r in rows)
    scored = [r for r in rows if r["published"] is not None]
    assert all(r["error_points"] == pytest.approx(r["predicted"] - r["published"]) for r in scored)
    assert all(bool(r["why"]) == (not r["held"]) for r in scored)


def test_lab_points_from_committed_results():
    from pathlib import Path

    from kit.plan import lab
    results = Path(__file__).resolve().parents[1] / "results"
    pts = lab.points(results)
    assert {p["source"] for p in pts} >= {"ps", "network", "ddp_lab", "mp"}
    assert all(p["error"] == pytest.approx((p["predicted_s"] - p["measured_s"]) / p["measured_s"]) for p in pts)
    zero = next(p for p in lab.memory_points(results) if p["point"] == "zero N=2")
    # ZeRO-1 at N = 2: params K + grads K + momentum K/2 = 2.5 K, K = 3,366,952 B
    assert zero["predicted_bytes"] == pytest.approx(2.5 * 3_366_952)


def test_ranking_flags_a_reversed_pair(tmp_path):
    import json

    from kit.plan import lab
    # naive (14 calls, nothing hidden) is predicted slower than one 4 MB bucket; measured here 10x faster instead
    rows = [{"scheme": "local", "step_ms": 10.0, "step_ms_range": [9, 11]},
            {"scheme": "naive", "step_ms": 10.0, "step_ms_range": [9, 11]},
            {"scheme": "buckets:4194304", "step_ms": 100.0, "step_ms_range": [99, 101]}]
    run = {"N": 2, "K": 4_000_000, "tensors": 14, "cfg": {"sizes": [10, 10, 10], "batch": 8},
           "timeline": {"forward": 1.0, "backward": 2.0}, "rows": rows}
    (tmp_path / "ddp_lab.json").write_text(json.dumps({"runs": [run]}))
    (tmp_path / "network.json").write_text(json.dumps({"link": {"alpha": 1e-4, "B": 1e8}, "latency": {"o": 0.0},
                                                       "rows": []}))
    pairs = lab.ranking(tmp_path)
    assert len(pairs) == 1 and pairs[0]["held"] is False
    assert lab.summary(lab.points(tmp_path))["n"] == 2


def test_memory_agrees_with_the_notebooks_formulas():
    from kit.ddp.memory import formula
    from kit.mp import model as mpm
    # the kit's float32 SGD + momentum: params, grads, momentum K bytes each, 3K in all; ZeRO stage s keeps
    # kit.ddp.memory.formula(s, N) of it (notebook 05)
    for kind, stage in (("dp", 0), ("zero1", 1), ("zero2", 2), ("zero3", 3)):
        r = run(kind, dp=4)
        state = r["params_bytes"] + r["grads_bytes"] + r["optimizer_bytes"]
        assert state / 12e6 == pytest.approx(formula(stage, 4))
    # TP over 4: notebook 06's memory_per_rank (state /n, the block's inputs and outputs whole, the rest /n)
    whole = Model(**{**M.__dict__, "tp_whole_bytes_per_sample_layer": 200})
    r = predict(whole, C, Strategy("tp", tp=4), 16)
    ref = mpm.memory_per_rank(1_000_000, 16 * 4 * 1000, n=4, scheme="tp", whole=16 * 4 * 200, opt_states=1)
    assert [r[k + "_bytes"] for k in ("params", "grads", "optimizer", "activations")] == \
        pytest.approx([ref[k] for k in ("params", "grads", "optimizer", "activations")])
    # TP's bytes handed to allreduce for the kit's MLP block (1 allreduce forward, 1 backward per block):
    # kit.mp.model.tp_handed_bytes(batch, hidden) = 2 · batch · d · 4; the model's per-layer allreduces carry it
    mlp = Model(params=10, layers=1, act_bytes_per_sample_layer=0, compute_s_per_sample_layer=0,
                boundary_bytes_per_sample=64 * 4, tp_allreduces_per_layer=2)
    bw = Link(alpha_s=0, bandwidth_Bps=1e6)
    r = predict(mlp, Cluster(1, 2, bw), Strategy("tp", tp=2), 32)
    # a ring over 2 ranks sends half of what is handed each way: 2·(2−1)/2 · handed / B
    assert r["exposed_comm_s"] == pytest.approx(mpm.ring_sent(mpm.tp_handed_bytes(32, 64), 2) / 1e6)
