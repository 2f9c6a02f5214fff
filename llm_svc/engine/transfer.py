"""Host ↔ device copies of one step. Every wait of the engine's step for the device goes
through `DeviceToHost.wait`, which counts it (`host_syncs`, the test hook that holds a
step to one); copies to the device never wait (pinned memory, non_blocking)."""

from __future__ import annotations

import numpy as np
import torch


class SyncCounter:
    """How many times the engine waited for the device (read by tests, per step)."""

    def __init__(self) -> None:
        self.count = 0


host_syncs = SyncCounter()


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """`array` on `device`; on CUDA staged through pinned memory, so the host does not wait."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


class DeviceToHost:
    """Starts copying a device tensor to the host now; `wait()` (the step's one sync)
    returns it once it has landed. On the CPU there is nothing to copy or wait for."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._event = None
        if tensor.device.type == "cuda":
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
            tensor = host
        self._host = tensor

    def wait(self) -> torch.Tensor:
        host_syncs.count += 1
        if self._event is not None:
            self._event.synchronize()
        return self._host
