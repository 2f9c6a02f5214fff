"""One rank's view of the tensor-parallel group: who it is, what slice of the model it
holds, and the collectives the model and the step channel use (torch.distributed).

Two process groups: `cpu` (gloo) carries the step's small host message, `device` the
tensors (NCCL on CUDA; on the CPU it is the same gloo group). Both get the explicit
`timeout_s`: gloo's default of 30 minutes would turn a dead or hung rank into a hang. The
default group serves only the rendezvous (over tcp://127.0.0.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

START_TIMEOUT_S = 300.0


class RankFailedError(RuntimeError):
    """A tensor-parallel rank died or stopped answering; the engine cannot go on."""


@dataclass
class RankLayout:
    """Which heads, features and vocabulary rows rank `rank` of `size` holds."""

    rank: int
    size: int

    def span(self, total: int) -> tuple[int, int]:
        """This rank's contiguous 1/size of `total` (which the size divides)."""
        each = total // self.size
        return self.rank * each, (self.rank + 1) * each

    def kv_heads(self, num_kv_heads: int) -> tuple[int, int]:
        """The KV heads [start, stop) this rank holds: a 1/size share, or, with fewer KV
        heads than ranks, the one head its query heads read (replicated, as vLLM does)."""
        if num_kv_heads >= self.size:
            return self.span(num_kv_heads)
        head = self.rank // (self.size // num_kv_heads)
        return head, head + 1

    def num_local_kv_heads(self, model) -> int:
        start, stop = self.kv_heads(model.num_kv_heads)
        return stop - start

    def vocab_slice(self, vocab: int) -> tuple[int, int]:
        """Rows of the vocabulary padded up to a multiple of the size."""
        each = -(-vocab // self.size)
        return self.rank * each, (self.rank + 1) * each


class RankGroup(RankLayout):
    """A RankLayout joined to the process group: the collectives of a step."""

    def __init__(self, rank: int, size: int, device: torch.device, cpu, device_group) -> None:
        super().__init__(rank, size)
        self.device = device
        self.cpu = cpu
        self.device_group = device_group

    @classmethod
    def join(
        cls, rank: int, size: int, port: int, device: torch.device, timeout_s: float
    ) -> RankGroup:
        """Join (or, rank 0, host) the group over tcp://127.0.0.1:`port`; blocks until every
        rank has joined, at most `timeout_s`."""
        # Starting ranks import torch and load weights first: the rendezvous waits longer
        # than a step may.
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=timedelta(seconds=max(timeout_s, START_TIMEOUT_S)),
        )
        timeout = timedelta(seconds=timeout_s)
        cpu = dist.new_group(backend="gloo", timeout=timeout)
        tensors = cpu
        if device.type == "cuda":
            tensors = dist.new_group(backend="nccl", timeout=timeout)
        return cls(rank, size, device, cpu, tensors)

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # --- collectives (every rank calls each one, in the same order) ---------------------
    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, group=self.device_group)
        return tensor

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.broadcast(tensor, src=0, group=self.device_group)
        return tensor

    def broadcast_host(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.broadcast(tensor, src=0, group=self.cpu)
        return tensor

    def ping(self) -> None:
        """An idle round: returns once every rank has answered (or the timeout raises)."""
        dist.all_reduce(torch.zeros(1), group=self.cpu)

    def min_host(self, value: int) -> int:
        """The smallest `value` over the ranks (the KV page count they all can hold)."""
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.cpu)
        return int(tensor.item())

    def gather_columns(self, local: torch.Tensor, total: int) -> torch.Tensor:
        """Every rank's [N, cols] side by side, trimmed to `total` columns."""
        parts = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(parts, local.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=-1)[:, :total]
