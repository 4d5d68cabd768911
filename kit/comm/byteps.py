"""A parameter server sharded over the workers themselves, as BytePS can place it: rank r is a worker AND the
server of shard r (k = N servers co-located with the N workers).

    allreduce_colocated(flat, Link("rank 0"))   # on every rank of the torch.distributed group: flat is summed

Each rank's link carries (N-1)/N·K out and (N-1)/N·K in during the push, the same again during the pull: the
ring's 2(N-1)/N·K each way, in 2 message latencies instead of the ring's 2(N-1). BytePS's own result (Jiang et
al., OSDI 2020) needs more: extra CPU-only servers whose links add bandwidth, and pushes pipelined with pulls,
so a worker's link carries only K each way (`kit.comm.costmodel.t_comm_ps(..., k, pipelined=True)`).
"""
from __future__ import annotations

from kit.comm.ps import shards


def allreduce_colocated(flat, link):
    """Sum `flat` over all ranks in place, each rank being a worker AND the server of shard `rank`: push every
    shard to its server, sum the shard this rank serves, pull every summed shard back."""
    import torch.distributed as dist
    rank, size = dist.get_rank(), dist.get_world_size()
    parts, others = shards(flat.numel(), size), [r for r in range(size) if r != rank]
    mine = parts[rank]
    inbox = {w: flat.new_empty(mine.stop - mine.start) for w in others}
    recvs = [link.irecv(inbox[w], src=w) for w in others]                        # receives first (see kit.comm.ring)
    sends = [link.isend(flat[parts[s]], dst=s) for s in others]                  # push: shard s to server s
    link.wait(recvs + sends, "a worker or server (push)")
    for w in others:                                                             # server: sum my shard
        flat[mine] += inbox[w]
    recvs = [link.irecv(flat[parts[s]], src=s) for s in others]
    sends = [link.isend(flat[mine], dst=w) for w in others]                      # pull: summed shards back
    link.wait(recvs + sends, "a worker or server (pull)")
