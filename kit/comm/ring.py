"""Ring-allreduce on real processes (notebook 03): neighbours only, in place, every byte counted.

    %%px
    traffic = kit.comm.ring.allreduce(tensor)     # in place; returns this rank's Traffic (bytes sent, peers, seconds)

The ring is Baidu's (Gibiansky 2017, "Bringing HPC techniques to deep learning"; the bandwidth-optimal ring is
Patarasuk & Yuan 2009): N-1 scatter-reduce steps, then N-1 allgather steps, on the schedule of `kit.comm.ring_sim`.
Messages travel over `kit.comm.link.Link`; a neighbour that dies or stops answering raises `PeerLostError`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from kit.comm.link import Link, PeerLostError  # noqa: F401  (PeerLostError: what a dead neighbour raises)
from kit.comm.ring_sim import chunk_bounds, recv_chunk, send_chunk


class RingError(ValueError):
    """The ranks disagree on the tensor (shape or dtype): nothing was sent."""


@dataclass
class Traffic:
    """What one rank put on the wire in one allreduce."""
    sent: int = 0            # bytes sent
    received: int = 0        # bytes received
    messages: int = 0        # point-to-point sends
    seconds: float = 0.0     # wall time of the call
    peers: set = field(default_factory=set)   # ranks this rank sent to


_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64")
_MAX_DIMS = 8


def _describe(tensor):
    """Return (dtype code, ndim, shape...) as a fixed-length int64 tensor: the metadata ranks compare."""
    import zlib
    import torch
    name = str(tensor.dtype).removeprefix("torch.")
    shape = list(tensor.shape)
    code = _DTYPES.index(name) if name in _DTYPES else len(_DTYPES) + zlib.crc32(name.encode()) % 1000
    if len(shape) > _MAX_DIMS:   # fold the extra dimensions into a checksum slot
        shape = shape[:_MAX_DIMS - 1] + [zlib.crc32(str(shape).encode()) % (2**31)]
    return torch.tensor([code, tensor.dim(), *shape, *[-1] * (_MAX_DIMS - len(shape))], dtype=torch.int64)


def _decode(meta) -> str:
    code, ndim, *shape = meta.tolist()
    dtype = _DTYPES[code] if code < len(_DTYPES) else "other"
    return f"shape {tuple(shape[:ndim]) if ndim <= _MAX_DIMS else '(>8 dims)'}, {dtype}"


def check_same(tensor, timeout: float | None = None):
    """Raise RingError on every rank unless all ranks hold a tensor of one shape and dtype (moves no data)."""
    import torch.distributed as dist
    meta = _describe(tensor)
    every = [meta.clone() for _ in range(dist.get_world_size())]
    link = Link(f"rank {dist.get_rank()}", timeout)
    link.wait([dist.all_gather(every, meta, async_op=True)], "the other ranks (comparing shapes)")
    if any(not m.equal(every[0]) for m in every):
        have = "; ".join(f"rank {r}: {_decode(m)}" for r, m in enumerate(every))
        raise RingError(f"allreduce needs one shape and dtype on every rank, got {have}")


def _pieces(bounds: tuple[int, int], piece: int) -> list[tuple[int, int]]:
    """Cut the chunk [start, stop) into pieces of at most `piece` elements (none if the chunk is empty)."""
    start, stop = bounds
    return [(a, min(a + piece, stop)) for a in range(start, stop, max(piece, 1))]


def _schedule(bounds, rank: int, size: int, phase: str, piece: int) -> list[tuple[int, int, int]]:
    """Return (step, start, stop) of every piece this rank receives in `phase`, in the order it receives them."""
    return [(s, c, d) for s in range(size - 1) for c, d in _pieces(bounds[recv_chunk(rank, s, size, phase)], piece)]


def scratch_numel(numel: int, size: int, piece: int) -> int:
    """Return the elements of each of scatter_reduce's two receive buffers: a piece, or a chunk if smaller."""
    return min(piece, max(b - a for a, b in chunk_bounds(numel, size)))


def make_scratch(flat, size: int, piece: int) -> list:
    """Return scatter_reduce's two receive buffers for `flat` (a caller that measures memory allocates them)."""
    return [flat.new_empty(scratch_numel(flat.numel(), size, piece)) for _ in range(2)]


def scatter_reduce(flat, rank, size, link, piece, scratch=None):
    """N-1 steps: send a chunk right while adding the one from the left; rank r ends owning chunk (r+1) % N.

    Each chunk moves as pieces of `piece` elements: the left neighbour's piece i+1 arrives in one scratch
    buffer while piece i is added from the other (double buffering: small, cache-sized scratch, no big copy;
    `scratch`: the two buffers, from make_scratch, else allocated here). The chunk added in step s is the one
    sent in step s+1, so each piece goes on to the right as soon as it is added: the steps overlap instead of
    waiting for each other.
    """
    bounds = chunk_bounds(flat.numel(), size)
    right, left = (rank + 1) % size, (rank - 1) % size
    into = _schedule(bounds, rank, size, "scatter_reduce", piece)
    scratch = scratch or make_scratch(flat, size, piece)
    # Receives first. Measured on a 1 Gbit/s lab link: with each rank's send posted before its receive, two
    # ranks exchanging 32 MB took 538 ms, twice one direction alone (the directions ran in turn); receive
    # first, 280 ms; the ring at N = 2, 64 MB went from 826 to 566 ms (the model: 574 ms). (Gloo's TCP pair
    # puts its "ready to receive" notices and its data in one send queue per peer.)
    recvs = [link.irecv(scratch[j][:d - c], left) for j, (_, c, d) in enumerate(into[:2])]
    sends = [link.isend(flat[a:b], right) for a, b in _pieces(bounds[send_chunk(rank, 0, size, "scatter_reduce")],
                                                                piece)]
    for j, (s, c, d) in enumerate(into):
        link.wait([recvs[j]], f"left neighbour rank {left} (scatter-reduce step {s + 1})")
        flat[c:d] += scratch[j % 2][:d - c]                 # in place, on a view of the flat buffer
        if j + 2 < len(into):                               # this scratch buffer is free again: next piece
            _, c2, d2 = into[j + 2]
            recvs.append(link.irecv(scratch[j % 2][:d2 - c2], left))
        if s < size - 2:
            sends.append(link.isend(flat[c:d], right))      # step s+1 sends this very piece: send it now
    link.wait(sends, f"right neighbour rank {right} (scatter-reduce)")


def allgather(flat, rank, size, link, piece):
    """N-1 steps: pass the complete chunks right, receiving the left one's straight into the flat buffer; like
    scatter-reduce, each piece goes on to the right as soon as it has arrived."""
    bounds = chunk_bounds(flat.numel(), size)
    right, left = (rank + 1) % size, (rank - 1) % size
    into = _schedule(bounds, rank, size, "allgather", piece)
    recvs = [link.irecv(flat[c:d], left) for _, c, d in into]   # receive first (see scatter_reduce), all at once
    sends = [link.isend(flat[a:b], right) for a, b in _pieces(bounds[send_chunk(rank, 0, size, "allgather")], piece)]
    for j, (s, c, d) in enumerate(into):
        link.wait([recvs[j]], f"left neighbour rank {left} (allgather step {s + 1})")
        if s < size - 2:
            sends.append(link.isend(flat[c:d], right))
    link.wait(sends, f"right neighbour rank {right} (allgather)")


def allreduce(tensor, *, piece_bytes: int = 4 * 2**20, check: bool = True, timeout: float | None = None) -> Traffic:
    """Sum `tensor` over all ranks IN PLACE with the ring (neighbours only); return this rank's Traffic.

    Call it on every rank of the torch.distributed group (cluster.init_process_group()). piece_bytes: the size
    of the pieces a chunk is pipelined in; check: first compare shapes/dtypes across ranks (a tiny allgather:
    RingError on every rank); with check=False, ranks holding different shapes make Gloo abort the process, and
    cluster.wait's RankDiedError quotes that crash (the stack through scatter_reduce), never an earlier call's
    output; timeout: seconds to wait for a neighbour (default: the cluster's KIT_TIMEOUT), then PeerLostError.
    """
    import torch.distributed as dist
    t0 = time.perf_counter()
    rank, size = dist.get_rank(), dist.get_world_size()
    if check:
        check_same(tensor, timeout)
    link = Link(f"rank {rank}", timeout)
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)   # a copy if strided
    if size > 1 and flat.numel():
        piece = max(1, piece_bytes // flat.element_size())
        scatter_reduce(flat, rank, size, link, piece)
        allgather(flat, rank, size, link, piece)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return _traffic(link, t0)


def _traffic(link: Link, t0: float) -> Traffic:
    return Traffic(link.sent, link.received, link.messages, time.perf_counter() - t0, set(link.peers))


def allreduce_naive(tensor, *, check: bool = True, timeout: float | None = None) -> Traffic:
    """Sum `tensor` IN PLACE the parameter-server way: everyone sends to rank 0, rank 0 sends the sum back.

    Here to learn from: rank 0 receives and sends (N-1)·K bytes, so its link is the bottleneck as N grows.
    """
    import torch.distributed as dist
    t0 = time.perf_counter()
    rank, size = dist.get_rank(), dist.get_world_size()
    if check:
        check_same(tensor, timeout)
    link = Link(f"rank {rank}", timeout)
    flat = tensor.contiguous().view(-1)
    if size > 1 and flat.numel():
        if rank == 0:
            inbox = [flat.new_empty(flat.numel()) for _ in range(1, size)]
            for src, work in enumerate([link.irecv(buf, src) for src, buf in enumerate(inbox, start=1)], start=1):
                link.wait([work], f"rank {src} (gather to rank 0)")
                flat += inbox[src - 1]
            link.wait([link.isend(flat, dst) for dst in range(1, size)], "a rank (broadcast from rank 0)")
        else:
            link.wait([link.isend(flat, 0)], "rank 0 (send to rank 0)")
            link.wait([link.irecv(flat, 0)], "rank 0 (receive from rank 0)")
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return _traffic(link, t0)


def allreduce_fused(tensors, name=None):
    """Copy the tensors into one flat buffer, allreduce it once, copy the sums back: tensor fusion by hand."""
    import torch
    flat = torch.cat([t.reshape(-1) for t in tensors])
    allreduce(flat)
    for t, piece in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(piece.view_as(t))
