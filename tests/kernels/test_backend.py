"""Backend selection: the default per device, forcing, and the interpreter requirement."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import iris_kernels
from iris_kernels import checksum, resolve_backend, scatter_rows


def test_cpu_tensors_default_to_the_twin(runs_on):
    with runs_on("scatter_rows", "torch"), runs_on("scatter_rows", "triton", times=0):
        scatter_rows(torch.zeros(4, 3), torch.ones(1, 3), [1])
    with runs_on("checksum", "torch"):
        checksum(torch.arange(4))


def test_cuda_device_defaults_to_triton():
    assert resolve_backend("probe", None, torch.device("cuda")) == "triton"
    assert resolve_backend("probe", "torch", torch.device("cuda")) == "torch"
    assert iris_kernels.CALLS[("probe", "triton")] >= 1


def test_forced_triton_on_cpu_needs_the_interpreter(monkeypatch):
    assert iris_kernels.interpreting()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not iris_kernels.interpreting()
    with pytest.raises(ValueError, match="needs TRITON_INTERPRET=1"):
        checksum(torch.arange(4), backend="triton")
    assert checksum(torch.arange(4), backend="torch") == checksum(torch.arange(4))


def test_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match=r"'gpu' unknown; expected one of \('triton', 'torch'\)"):
        checksum(torch.arange(4), backend="gpu")


def test_interpreter_switched_on_after_import():
    # In a full test run another folder may import iris_kernels (and triton) before this folder's
    # conftest sets TRITON_INTERPRET; every kernel must still run interpreted afterwards.
    script = """
import os, torch, iris_kernels
assert not iris_kernels.interpreting()
os.environ["TRITON_INTERPRET"] = "1"
dest = torch.zeros(4, 3)
iris_kernels.scatter_rows(dest, torch.ones(1, 3), [2], backend="triton")
iris_kernels.scatter_rows(dest, torch.ones(1, 3) * 2, [0], backend="triton")
data = torch.arange(40000, dtype=torch.int32)
same = iris_kernels.checksum(data, backend="triton") == iris_kernels.checksum(data, backend="torch")
print(dest.sum().item(), same)
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[0] == "9.0 True"


@pytest.mark.parametrize("interpreted", [True, False])
def test_attention_kernels_share_one_tile_step_built_for_their_mode(interpreted):
    from triton.runtime import JITFunction

    from iris_kernels import attention_tile, backend
    from iris_kernels.paged_attention_decode import _decode_split_kernel
    from iris_kernels.paged_attention_extend import _extend_kernel

    step = attention_tile.attend_tile.build(interpreted)
    for kernel in (_decode_split_kernel, _extend_kernel):
        assert kernel.build(interpreted).fn.__globals__["attend_tile"] is step
    # Compiled: a JITFunction for the kernel's compiler to call; interpreted: the
    # interpreter's Python function, run under the patch the kernel's launch put in place.
    assert isinstance(step, JITFunction) is not interpreted
    combiner = step.__globals__["SUM_COMBINE"]
    assert (combiner is backend._compiled_add()) is not interpreted
