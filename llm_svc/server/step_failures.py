"""What a failed engine step was, and the test-only hook that makes steps fail.

`classify(error)`: OUT_OF_MEMORY (the step asked for more device memory than there was: a
smaller step may fit), DEVICE (any other CUDA / accelerator error: the device context is
poisoned and nothing on it can be trusted, so the pod exits at once), or STEP (anything
else: the step's requests fail, the pod probes and serves again if the probe passes).

`step_fault_from_env()`: the hook tests use to break a pod's steps on purpose. It is read
only when `IRIS_TEST_HOOKS=1` is set in the pod's environment, a flag no deployment sets (the
chart and `iris up` never do); without it `IRIS_TEST_STEP_FAULT` is ignored, so a
production pod cannot be made to fail its steps by configuration.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable, Mapping

import torch

log = logging.getLogger(__name__)

TEST_HOOKS_FLAG = "IRIS_TEST_HOOKS"
STEP_FAULT_VAR = "IRIS_TEST_STEP_FAULT"
_DEVICE_MARKERS = ("CUDA error", "CUBLAS_STATUS", "cuDNN error", "device-side assert")


class StepFailure(enum.StrEnum):
    OUT_OF_MEMORY = "out_of_memory"
    DEVICE = "device"
    STEP = "step"


def classify(error: BaseException) -> StepFailure:
    """Which kind of failure `error` (raised by a step) is; see the module docstring."""
    text = str(error)
    if isinstance(error, torch.OutOfMemoryError) or "out of memory" in text.lower():
        return StepFailure.OUT_OF_MEMORY
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(error, accelerator_error):
        return StepFailure.DEVICE
    if any(marker in text for marker in _DEVICE_MARKERS):
        return StepFailure.DEVICE
    return StepFailure.STEP


def _raiser(kind: str) -> Callable[[], None]:
    def raise_step() -> None:
        raise RuntimeError("injected step fault (IRIS_TEST_STEP_FAULT=step)")

    def raise_oom() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory (injected: IRIS_TEST_STEP_FAULT)")

    def raise_device() -> None:
        raise RuntimeError(
            "CUDA error: an illegal memory access was encountered (injected: IRIS_TEST_STEP_FAULT)"
        )

    raisers = {"step": raise_step, "oom": raise_oom, "device": raise_device}
    if kind not in raisers:
        raise ValueError(
            f"{STEP_FAULT_VAR} kind {kind!r} is invalid: must be one of {sorted(raisers)}"
        )
    return raisers[kind]


def step_fault(spec: str) -> Callable[[], None]:
    """The hook for `spec` = KIND[:COUNT]: KIND is step, oom or device; the first COUNT steps
    (probes included) fail, or every step when COUNT is absent."""
    kind, _, count_text = spec.partition(":")
    raise_fault = _raiser(kind)
    left = [int(count_text)] if count_text else None

    def fault() -> None:
        if left is not None:
            if left[0] <= 0:
                return
            left[0] -= 1
        raise_fault()

    return fault


def test_hooks_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the pod runs with its test hooks on (IRIS_TEST_HOOKS=1; never in a deployment)."""
    return environ.get(TEST_HOOKS_FLAG) == "1"


def step_fault_from_env(environ: Mapping[str, str] = os.environ) -> Callable[[], None] | None:
    """The test hook the environment asks for, or None (always None without the flag)."""
    spec = environ.get(STEP_FAULT_VAR, "")
    if environ.get(TEST_HOOKS_FLAG) != "1":
        if spec:
            log.warning("%s is ignored: %s is not set", STEP_FAULT_VAR, TEST_HOOKS_FLAG)
        return None
    if not spec:
        return None
    log.warning("TEST HOOK: engine steps fail on purpose (%s=%s)", STEP_FAULT_VAR, spec)
    return step_fault(spec)
