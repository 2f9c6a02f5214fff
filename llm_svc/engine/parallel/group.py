"""One rank's view of the tensor-parallel group: who it is, what slice of the model it
holds, and the collectives the model and the step channel use (torch.distributed).

Process groups: `cpu` (gloo) carries the step's small host message, the tensor group the
tensors (NCCL on CUDA; on the CPU it is the same gloo group); both get the explicit
`timeout_s` (gloo's default of 30 minutes would turn a dead or hung rank into a hang). A
third gloo group with a start timeout serves what ranks exchange while some may still be
loading weights: the memory budget's profiling step (`collectives_on_start_group`) and the
page count agreed after it (`min_host`). The rendezvous is a TCPStore on tcp://127.0.0.1.

A step rank 0 gives up on a local error (its own out-of-memory, say) is *dropped*: rank 0
marks the group's generation as dropped in the store and `reset`s (it leaves the step
groups, which closes their connections, and joins the next generation's); a rank still in
that step's collectives sees them fail (at once on gloo, at the timeout on NCCL), finds
the mark (`step_dropped`) and resets too. Without the mark, a failed collective is a rank
failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

START_TIMEOUT_S = 300.0


class RankFailedError(RuntimeError):
    """A tensor-parallel rank died or stopped answering; the engine cannot go on."""


class CollectiveError(RuntimeError):
    """A collective failed or timed out (a peer died, hung, or dropped the step)."""


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
    """A RankLayout joined to its engine's process groups: the collectives of a step.

    The groups are built directly on a TCPStore at 127.0.0.1 (no torch.distributed default
    group), so one process may hold several tensor-parallel engines, one after another or
    at once, each with its own ranks."""

    def __init__(self, rank, size, device, store, start, cpu, tensors, timeout) -> None:
        super().__init__(rank, size)
        self.device = device
        self._store, self._start, self.cpu, self._tensors = store, start, cpu, tensors
        self._starting = False  # inside collectives_on_start_group
        self._timeout = timeout
        self.generation = 0  # of the step groups; a dropped step starts the next one

    @classmethod
    def join(
        cls, rank: int, size: int, port: int, device: torch.device, timeout_s: float
    ) -> RankGroup:
        """Join (rank 0: host) the groups at tcp://127.0.0.1:`port`. Starting ranks import
        torch and load weights first, so the rendezvous and the start group wait up to
        START_TIMEOUT_S; the step groups time out after `timeout_s`."""
        start_timeout = timedelta(seconds=max(timeout_s, START_TIMEOUT_S))
        store = dist.TCPStore(
            "127.0.0.1", port, size, rank == 0, start_timeout, wait_for_workers=False
        )
        timeout = timedelta(seconds=timeout_s)
        start = dist.ProcessGroupGloo(dist.PrefixStore("start", store), rank, size, start_timeout)
        cpu, tensors = _step_groups(store, "", rank, size, device, timeout)
        return cls(rank, size, device, store, start, cpu, tensors, timeout)

    def leave(self) -> None:
        """Drop the groups (their connections close with them)."""
        self._start = self.cpu = self._tensors = self._store = None

    @contextmanager
    def collectives_on_start_group(self) -> Iterator[None]:
        """Inside, the tensor collectives (`all_reduce`, `gather_columns`) run on the start
        group (START_TIMEOUT_S), staged through host memory since it is gloo: for the
        memory budget's profiling step, which one rank may reach while another still loads
        its weights. On leaving (without an error) one exchange on the step group brings up
        its communicator while the ranks are together, so NCCL's own buffers already count
        in the budget's `other`."""
        self._starting = True
        try:
            yield
        finally:
            self._starting = False
        self.all_reduce(torch.zeros(1, device=self.device))

    # --- a dropped step -----------------------------------------------------------------
    def drop_step(self) -> None:
        """Rank 0, after a local error inside a step: tell the others to drop it, and
        reset. Raises CollectiveError if the others do not join the next generation."""
        self._store.set(f"dropped/{self.generation}", "1")
        self.reset()

    def step_dropped(self) -> bool:
        """Rank 0 dropped this generation's step (so a failed collective was no failure)."""
        return self._store.check([f"dropped/{self.generation}"])

    def reset(self) -> None:
        """Leave the step groups (closing their connections ends a peer's wait in them),
        meet every rank on the start group (up to its timeout: on NCCL a peer notices at
        its step timeout), and join the next generation's step groups."""
        tensors, self.cpu, self._tensors = self._tensors, None, None
        if tensors is not None and self.device.type == "cuda":
            tensors.abort()  # NCCL would keep a peer waiting in it until its timeout
        del tensors
        self.generation += 1
        try:
            self._start.allreduce([torch.zeros(1)]).wait()
            self.cpu, self._tensors = _step_groups(
                self._store, f"{self.generation}/", self.rank, self.size, self.device,
                self._timeout,
            )  # fmt: skip
        except RuntimeError as err:
            raise CollectiveError(f"the ranks did not meet after a dropped step: {err}") from err

    # --- collectives (every rank calls each one, in the same order) ---------------------
    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._starting:
            host = tensor.cpu()
            with _collective():
                self._start.allreduce([host]).wait()
            return tensor.copy_(host)
        with _collective():
            self._tensors.allreduce([tensor]).wait()
        return tensor

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        with _collective():
            self._tensors.broadcast([tensor], _from_rank_0()).wait()
        return tensor

    def broadcast_host(self, tensor: torch.Tensor) -> torch.Tensor:
        with _collective():
            self.cpu.broadcast([tensor], _from_rank_0()).wait()
        return tensor

    def ping(self) -> None:
        """An idle round: returns once every rank has answered (or the timeout raises)."""
        with _collective():
            self.cpu.allreduce([torch.zeros(1)]).wait()

    def min_host(self, value: int) -> int:
        """The smallest `value` over the ranks (the KV page count they all can hold). On
        the start group: ranks reach it once their weights are loaded, which may take
        longer than a step's timeout."""
        tensor = torch.tensor([value], dtype=torch.int64)
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MIN
        with _collective():
            self._start.allreduce([tensor], options).wait()
        return int(tensor.item())

    def gather_columns(self, local: torch.Tensor, total: int) -> torch.Tensor:
        """Every rank's [N, cols] side by side, trimmed to `total` columns."""
        if self._starting:
            host = local.cpu().contiguous()
            staged = [torch.empty_like(host) for _ in range(self.size)]
            with _collective():
                self._start.allgather([staged], [host]).wait()
            # On the device as the step group's gather holds them: the profile's peak.
            return torch.cat([part.to(local.device) for part in staged], dim=-1)[:, :total]
        parts = [torch.empty_like(local) for _ in range(self.size)]
        with _collective():
            self._tensors.allgather([parts], [local.contiguous()]).wait()
        return torch.cat(parts, dim=-1)[:, :total]


@contextmanager
def _collective():
    """A collective's own failure (a lost, silent or departed peer) as CollectiveError;
    running out of device memory in it stays what it is (a local error)."""
    try:
        yield
    except (torch.OutOfMemoryError, CollectiveError):
        raise
    except (RuntimeError, AttributeError) as err:  # AttributeError: the groups were left
        raise CollectiveError(str(err)) from err


def _step_groups(store, prefix: str, rank: int, size: int, device: torch.device, timeout):
    """(the host group, the tensor group) of one generation: gloo, and NCCL on CUDA."""
    cpu = dist.ProcessGroupGloo(dist.PrefixStore(f"{prefix}cpu", store), rank, size, timeout)
    if device.type != "cuda":
        return cpu, cpu
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return cpu, dist.ProcessGroupNCCL(dist.PrefixStore(f"{prefix}nccl", store), rank, size, options)


def _from_rank_0():
    options = dist.BroadcastOptions()
    options.rootRank = 0
    return options
