"""Kernel tests run the Triton kernels on the CPU through Triton's interpreter.

TRITON_INTERPRET must be in the environment before any kernel launches; `kernels` builds its
kernels at first launch, so setting it here (at collection) is early enough even when another
test folder imported `kernels` first.
"""

import contextlib
import os

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"

import iris_kernels  # noqa: E402


@pytest.fixture
def runs_on():
    """`with runs_on("scatter_rows", "triton"): ...` fails unless that path ran exactly once."""

    @contextlib.contextmanager
    def expect(kernel: str, backend: str, times: int = 1):
        before = iris_kernels.CALLS[(kernel, backend)]
        yield
        assert iris_kernels.CALLS[(kernel, backend)] - before == times

    return expect


@pytest.fixture
def compiled_triton(monkeypatch):
    """The CUDA device with the interpreter off, so Triton compiles for the GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return torch.device("cuda")
