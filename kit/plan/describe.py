"""Typed descriptions of what a plan is made of: a model, the links of a cluster, a strategy. Frozen dataclasses,
their units in their field names; every field is checked at construction and a bad one raises `PlanError`, naming
the field, its value and what is allowed.

    Model(params, layers, act_bytes_per_sample_layer, compute_s_per_sample_layer, ...)
    Link(alpha_s, bandwidth_Bps, overhead_s)
    Cluster(hosts, ranks_per_host, intra=Link(...), inter=Link(...), device_memory_bytes)
    Strategy(kind, dp=, tp=, pp=, microbatches=, schedule=, bucket_bytes=, placement=)

`check(model, cluster, strategy, global_batch)` checks what only the three together can say (a strategy needing
more ranks than the cluster has, a TP group larger than a host, more stages than layers, too small a batch).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

KINDS = ("dp", "dp_overlap", "dp_bucketed", "zero1", "zero2", "zero3", "fsdp", "ps", "ps_colocated", "tp", "pp",
         "dp_pp", "dp_tp", "tp_pp")
SCHEDULES = ("afab", "1f1b")
PLACEMENTS = ("tp_in_host", "tp_across")


class PlanError(ValueError):
    """A description the planner cannot use; the message names the field, its value and what is allowed."""


def _need(ok: bool, where: str, name: str, value, allowed: str):
    if not ok:
        raise PlanError(f"{where}.{name} = {value!r}: {allowed}")


def _number(where: str, name: str, value, low: float = 0.0, strict: bool = False, whole: bool = False):
    """Refuse a value that is not a finite number >= low (> low if strict; a whole number if whole)."""
    kind = "a whole number" if whole else "a number"
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if strict else value >= low) and (not whole or float(value).is_integer())
    _need(ok, where, name, value, f"must be {kind} {'>' if strict else '>='} {low:g}")


@dataclass(frozen=True)
class Model:
    """A model, per sample and per layer, as one device runs it.

    params                        Ψ, parameters in all (count)
    layers                        L, the repeated blocks a pipeline splits and TP shards (count)
    act_bytes_per_sample_layer    activation bytes one sample leaves for backward in one layer, on one device
    compute_s_per_sample_layer    forward + backward seconds of one sample through one layer on one device
    boundary_bytes_per_sample     bytes of one sample's activation between two layers (what a PP stage sends on,
                                  what one TP allreduce carries); 0: unknown, PP and TP then cost no bytes
    tp_whole_bytes_per_sample_layer  the part of act_bytes_per_sample_layer that TP keeps whole on every rank (the
                                  block's inputs and outputs; Korthikanti et al. 2022's 10sbh of 34sbh + 5as²b)
    bytes_per_param               bytes of one parameter and of its gradient (4: the kit's float32; 2: fp16)
    optimizer_bytes_per_param     optimizer state per parameter (4: SGD momentum fp32, 8: Adam fp32, 12: mixed-
                                  precision Adam's fp32 copy + m + v, Rajbhandari et al. 2020's K = 12)
    tensors                       parameter tensors (one allreduce each for plain DP); 0: two per layer
    backward_share                the share of the compute that is backward (the window DP overlaps with)
    tp_allreduces_per_layer       allreduces TP makes per layer per step (Megatron's transformer layer: 2 forward +
                                  2 backward; the kit's MLP block: 1 + 1)
    """
    params: int
    layers: int
    act_bytes_per_sample_layer: float
    compute_s_per_sample_layer: float
    boundary_bytes_per_sample: float = 0.0
    tp_whole_bytes_per_sample_layer: float = 0.0
    bytes_per_param: float = 4
    optimizer_bytes_per_param: float = 4
    tensors: int = 0
    backward_share: float = 2 / 3
    tp_allreduces_per_layer: int = 4

    def __post_init__(self):
        w = "Model"
        _number(w, "params", self.params, 1, whole=True)
        _number(w, "layers", self.layers, 1, whole=True)
        for name in ("act_bytes_per_sample_layer", "compute_s_per_sample_layer", "boundary_bytes_per_sample",
                     "tp_whole_bytes_per_sample_layer", "optimizer_bytes_per_param"):
            _number(w, name, getattr(self, name))
        _number(w, "bytes_per_param", self.bytes_per_param, 0, strict=True)
        _number(w, "tensors", self.tensors, 0, whole=True)
        _number(w, "tp_allreduces_per_layer", self.tp_allreduces_per_layer, 0, whole=True)
        _need(0 <= self.backward_share <= 1, w, "backward_share", self.backward_share, "must be in [0, 1]")
        _need(self.tp_whole_bytes_per_sample_layer <= self.act_bytes_per_sample_layer, w,
              "tp_whole_bytes_per_sample_layer", self.tp_whole_bytes_per_sample_layer,
              f"must be <= act_bytes_per_sample_layer = {self.act_bytes_per_sample_layer!r} (a part of it)")

    @property
    def calls(self) -> int:
        """Parameter tensors, one allreduce each for plain DP (two per layer when not given)."""
        return self.tensors or 2 * self.layers


@dataclass(frozen=True)
class Link:
    """One level's link, as each rank sees it when every rank talks at once.

    alpha_s        a message's latency (s): ping-pong's one-way time of a tiny message
    bandwidth_Bps  bytes per second each way (inside a host: a rank's; between hosts: a host's NIC, which the
                   groups crossing it at once share, `Cluster.link`)
    overhead_s     LogP's o (s): serial cost per further message one process handles (a server's N pushes)
    """
    alpha_s: float
    bandwidth_Bps: float
    overhead_s: float = 0.0

    def __post_init__(self):
        _number("Link", "alpha_s", self.alpha_s)
        _number("Link", "bandwidth_Bps", self.bandwidth_Bps, 0, strict=True)
        _number("Link", "overhead_s", self.overhead_s)


@dataclass(frozen=True)
class Cluster:
    """hosts × ranks_per_host ranks; `intra` links ranks of one host (bandwidth_Bps: one rank's, each way),
    `inter` the hosts (bandwidth_Bps: one host's NIC, each way; the same link as intra when not given);
    device_memory_bytes: what one rank may hold (inf: no limit)."""
    hosts: int
    ranks_per_host: int
    intra: Link
    inter: Link | None = None
    device_memory_bytes: float = field(default=math.inf)

    def __post_init__(self):
        _number("Cluster", "hosts", self.hosts, 1, whole=True)
        _number("Cluster", "ranks_per_host", self.ranks_per_host, 1, whole=True)
        for name in ("intra", "inter"):
            v = getattr(self, name)
            _need(isinstance(v, Link) or (name == "inter" and v is None), "Cluster", name, v, "must be a Link")
        _need(isinstance(self.device_memory_bytes, (int, float)) and self.device_memory_bytes > 0, "Cluster",
              "device_memory_bytes", self.device_memory_bytes, "must be a number > 0 (math.inf: no limit)")

    @property
    def ranks(self) -> int:
        return self.hosts * self.ranks_per_host

    def link(self, size: int, stride: int) -> Link:
        """The link of a group of `size` ranks, `stride` apart: `intra` inside a host; `inter` if the group spans
        hosts, its bandwidth shared by the min(stride, ranks_per_host) groups that cross each host at once (a
        host-ordered ring crosses a host's NIC once each way, so one group alone gets the NIC's whole rate)."""
        if (size - 1) * stride < self.ranks_per_host:
            return self.intra
        link, sharing = self.inter or self.intra, min(stride, self.ranks_per_host)
        return Link(link.alpha_s, link.bandwidth_Bps / sharing, link.overhead_s)


@dataclass(frozen=True)
class Strategy:
    """How the ranks share the work.

    kind          one of KINDS; dp_tp: DP over TP groups (Megatron-LM 2019); every DP kind but dp_overlap and
                  dp_bucketed exchanges its gradients after backward
    dp, tp, pp    the degrees: ranks = dp·tp·pp ("ps": dp workers, plus `servers` on hosts of their own)
    microbatches  m, and schedule ("afab" or "1f1b"), for PP
    bucket_bytes  dp_bucketed's bucket size (bytes)
    placement     "tp_in_host": TP ranks adjacent, PP then DP across; "tp_across": PP ranks adjacent
    """
    kind: str
    dp: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    bucket_bytes: float = 25 * 2**20
    servers: int = 1
    placement: str = "tp_in_host"

    def __post_init__(self):
        w = "Strategy"
        _need(self.kind in KINDS, w, "kind", self.kind, f"must be one of {', '.join(KINDS)}")
        for name in ("dp", "tp", "pp", "microbatches", "servers"):
            _number(w, name, getattr(self, name), 1, whole=True)
        _number(w, "bucket_bytes", self.bucket_bytes, 0, strict=True)
        _need(self.schedule in SCHEDULES, w, "schedule", self.schedule, f"must be one of {', '.join(SCHEDULES)}")
        _need(self.placement in PLACEMENTS, w, "placement", self.placement, f"must be one of {', '.join(PLACEMENTS)}")
        uses = {"tp": "tp" in self.kind, "pp": "pp" in self.kind,
                "dp": self.kind not in ("tp", "pp", "tp_pp")}
        for name, used in uses.items():
            _need(used or getattr(self, name) == 1, w, name, getattr(self, name), f"must be 1 for kind={self.kind!r}")
        _need("pp" in self.kind or self.microbatches == 1, w, "microbatches", self.microbatches,
              f"must be 1 for kind={self.kind!r} (no pipeline)")

    @property
    def ranks(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def strides(self) -> dict:
        """Rank distance between neighbours of each group: TP's ranks adjacent (tp_in_host) or PP's (tp_across)."""
        if self.placement == "tp_in_host":
            return {"tp": 1, "pp": self.tp, "dp": self.tp * self.pp}
        return {"pp": 1, "tp": self.pp, "dp": self.tp * self.pp}


def check(model: Model, cluster: Cluster, strategy: Strategy, global_batch: float):
    """Refuse a combination the planner cannot place (PlanError naming the field)."""
    s = strategy
    _number("predict", "global_batch", global_batch, 0, strict=True)
    need = s.ranks + (s.servers if s.kind == "ps" else 0)
    _need(need <= cluster.ranks, "Strategy", "dp·tp·pp", need,
          f"needs more ranks than the cluster has ({cluster.hosts} hosts × {cluster.ranks_per_host} = "
          f"{cluster.ranks}): lower the degrees or add hosts")
    _need(s.tp <= cluster.ranks_per_host, "Strategy", "tp", s.tp,
          f"must be <= Cluster.ranks_per_host = {cluster.ranks_per_host} (a TP group lives inside one host; "
          "placement='tp_across' spreads a smaller group over hosts)")
    _need(s.pp <= model.layers, "Strategy", "pp", s.pp, f"must be <= Model.layers = {model.layers} (a stage holds "
          "at least one layer)")
    _need(global_batch >= s.dp * s.microbatches, "predict", "global_batch", global_batch,
          f"must be >= dp·microbatches = {s.dp * s.microbatches} (every micro-batch at least one sample)")
