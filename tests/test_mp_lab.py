"""kit.mp.lab on a two-level lab (2 hosts x 2 engines, 1 Gbit/s between hosts): both placements of tensor and
pipeline parallelism compute the same loss, and each host's NIC sends the bytes the model says (within 3%)."""
import pytest

import kit.netlab
from kit.mp import lab as mplab

pytestmark = [pytest.mark.lab, pytest.mark.engines, pytest.mark.requires_root]


def test_placements_on_two_hosts_send_the_bytes_of_the_model(no_leaks):
    cfg = {"d": 64, "mb": 1024, "m": 2, "blocks": 2, "reps": 2}   # K = 256 KiB: headers stay < 3%
    with kit.netlab.start(hosts=2, rate="1gbit") as lab:
        with kit.cluster.start(n=4, backend="gloo", hosts=lab, quiet=True, timeout=60) as c:
            c.init_process_group()
            x = mplab.placement(c, cfg=cfg, rate="1gbit")
    claims = {c.name: c for c in mplab.claims(x)}
    assert claims["loss of the two placements (relative)"].held, claims
    for r in x["rows"]:
        assert claims[f"NIC payload / model ({r['placement']})"].held, claims
        assert set(r["nic_tx_by_host"]) == {"h1", "h2"}
    tx = {r["placement"]: r["model_tx"] for r in x["rows"]}
    assert tx["tp_across"] == (4 * 2 - 1) / 2 * tx["tp_in_host"]      # TP's bytes: 3.5x PP's at 2 blocks a stage


def test_placement_refuses_a_layout_it_cannot_use():
    with pytest.raises(ValueError, match="placement must be one of"):
        mplab.layout("tp_everywhere", 0)
