"""The other ranks' processes: started with torch.multiprocessing spawn, watched, stopped.

Each rank process dies with its parent (PR_SET_PDEATHSIG), so a pod killed by its
supervisor or by Kubernetes leaves no rank behind; a rank that exits while the engine runs
is logged by number and reported through `on_exit`.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing.connection
import signal
import socket
import threading
from dataclasses import replace

import torch
import torch.multiprocessing as mp

from llm_svc.engine.config import EngineConfig
from llm_svc.engine.parallel.group import RankGroup

log = logging.getLogger(__name__)
STOP_WAIT_S = 10.0
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    device = torch.device(config.device)
    if device.type != "cuda":
        return device
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def join_group(
    rank: int, size: int, port: int, device: torch.device, timeout_s: float
) -> RankGroup:
    return RankGroup.join(rank, size, port, device, timeout_s)


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the group's timeout still ends an orphaned rank
        pass


def rank_main(index: int, config: EngineConfig, port: int) -> None:
    """Entry of rank `index + 1`: join the group, load the shard, serve steps until STOP."""
    from llm_svc.engine.parallel.runner import ShardRunner

    _die_with_parent()
    rank, size = index + 1, config.tensor_parallel_size
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {rank} %(message)s")
    device = rank_device(config, rank)
    if device.type == "cpu":
        torch.set_num_threads(1)
    group = join_group(rank, size, port, device, config.tensor_parallel_timeout_s)
    try:
        runner = ShardRunner(replace(config, device=str(device)), group)
        runner.serve()
    except Exception:
        log.exception("tensor-parallel rank %d failed", rank)
        raise
    finally:
        group.leave()


class RankProcesses:
    """Ranks 1..size-1 of `config.tensor_parallel_size`; `on_exit(message)` is called
    (from a watcher thread) when one exits before `stop`."""

    def __init__(self, config: EngineConfig, on_exit) -> None:
        self.port = free_port()
        self._stopping = threading.Event()
        self._on_exit = on_exit
        self.context = mp.start_processes(
            rank_main,
            args=(config, self.port),
            nprocs=config.tensor_parallel_size - 1,
            join=False,
            daemon=True,
            start_method="spawn",
        )
        self.processes = self.context.processes
        threading.Thread(target=self._watch, name="tp-ranks", daemon=True).start()

    @property
    def pids(self) -> dict[int, int]:
        """{rank: pid} of the other ranks."""
        return {index + 1: proc.pid for index, proc in enumerate(self.processes)}

    def describe(self) -> str:
        """Which ranks are gone (with exit codes), or that all live but did not answer."""
        gone = [
            f"rank {index + 1} exited with code {proc.exitcode}"
            for index, proc in enumerate(self.processes)
            if not proc.is_alive()
        ]
        if gone:
            return "; ".join(gone)
        ranks = ", ".join(str(rank) for rank in self.pids)
        return f"rank(s) {ranks} alive but did not answer in time"

    def _watch(self) -> None:
        sentinels = {proc.sentinel: index + 1 for index, proc in enumerate(self.processes)}
        while sentinels and not self._stopping.is_set():
            ready = multiprocessing.connection.wait(list(sentinels), timeout=1.0)
            for sentinel in ready:
                rank = sentinels.pop(sentinel)
                if self._stopping.is_set():
                    return
                process = self.processes[rank - 1]
                process.join(STOP_WAIT_S)  # the sentinel may fire before the exit is reaped
                code = process.exitcode
                self._on_exit(f"tensor-parallel rank {rank} exited with code {code}")

    def kill(self) -> None:
        """End the ranks now (a failed start: they have nothing to finish)."""
        self._stopping.set()
        for proc in self.processes:
            if proc.is_alive():
                proc.kill()
            proc.join()

    def stop(self) -> None:
        """Wait up to STOP_WAIT_S for the ranks to leave, then kill what is left."""
        self._stopping.set()
        for proc in self.processes:
            proc.join(STOP_WAIT_S)
        for proc in self.processes:
            if proc.is_alive():
                proc.kill()
                proc.join()
