"""Loading builds each layer in its target dtype and layout and allocates it once
(docs/design/engine.md, "Loading"; issue 43).

Two measures, both on checkpoints of a realistic size (tests/llm_svc/big_checkpoints.py):
- the process's anonymous memory (RssAnon in /proc/PID/status), sampled from outside while a
  child process loads: total RSS would also count the checkpoint's mmapped file pages,
  which any loader touches while copying. Sampling can miss a short peak but never invents
  one, so the bound cannot fail spuriously; the growth must also reach the weights' bytes,
  so the measure is seen to work. Linux maps memory that is allocated but never written
  to the shared zero page, so a float32 build that is cast before anything is written to
  it costs no resident memory on the CPU: this measure catches the FP8 case (the old
  loader wrote a bf16 copy of every FP8 layer first), not that one.
- the bytes of every tensor that torch ops create on the load's device, counted in-process
  with a dispatch mode: the CPU stand-in for CUDA's allocator statistics (no GPU here),
  which sees an allocation whether or not it is written (bench/gpu_memory_check.py reads
  the real `torch.cuda.max_memory_allocated` on a GPU).
Under tensor parallelism each rank reads only its share of each tensor (issue 63): the bytes
the checkpoint reader hands out, and the peak of what torch ops hold while a rank loads.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import weakref
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from llm_svc.engine.memory_budget import module_bytes
from llm_svc.engine.models import load_model, loader
from llm_svc.engine.models.quantization import Fp8Linear
from llm_svc.engine.models.registry import build_decoder
from llm_svc.engine.parallel.group import RankLayout
from llm_svc.engine.parallel.sharding import shard_decoder
from tests.llm_svc.big_checkpoints import FP8, big_llama, fp8_copy
from tests.llm_svc.checkpoints import tiny_checkpoint
from tests.llm_svc.family_checkpoints import family_checkpoint, stacked_experts_copy

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("load_child.py")
BOUND = 1.15  # peak growth over the loaded parameters' bytes


@pytest.fixture(scope="session")
def big_bf16(tmp_path_factory) -> Path:
    return big_llama(tmp_path_factory.mktemp("big-llama-bf16"))


@pytest.fixture(scope="session")
def big_fp8(big_bf16, tmp_path_factory) -> Path:
    return fp8_copy(big_bf16, tmp_path_factory.mktemp("big-llama-fp8"))


def _anon_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssAnon in /proc/{pid}/status")


def anon_growth_during_load(model_dir: Path, dtype: str) -> tuple[int, int, int]:
    """(peak, final) growth of a child's anonymous memory while it loads `model_dir` in
    `dtype`, and the loaded parameters' bytes."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    warmup = tiny_checkpoint("llama")
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(model_dir), str(warmup), dtype],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "ready"
        base = peak = _anon_bytes(child.pid)
        loaded = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not loaded.wait(0.001):  # not a busy loop: the child needs the cores
                peak = max(peak, _anon_bytes(child.pid))

        sampler = threading.Thread(target=sample)
        sampler.start()
        child.stdin.write("go\n")
        child.stdin.flush()
        line = child.stdout.readline()
        loaded.set()
        sampler.join()
        assert line.strip().isdigit(), f"the child failed to load {model_dir}"
        final = _anon_bytes(child.pid)
        peak = max(peak, final)
        child.stdin.write("exit\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
    return peak - base, final - base, int(line)


@pytest.mark.parametrize("checkpoint", ["big_bf16", "big_fp8"])
def test_loading_grows_anonymous_memory_by_the_weights_alone(request, checkpoint):
    model_dir = request.getfixturevalue(checkpoint)
    peak, final, params = anon_growth_during_load(model_dir, "bfloat16")
    assert params >= 70e6  # 135 MB in bf16; the FP8 copy holds a little over half as many
    assert final >= 0.85 * params, "the measure did not see the weights arrive"
    assert peak <= BOUND * params, (
        f"anonymous memory grew {peak / params:.2f}x the weights ({params >> 20} MiB) "
        f"while loading {checkpoint}"
    )


def created_storages(args, kwargs, out):
    """(tensor, storage) for each output of a torch op that shares no storage with the op's
    inputs: what the op created, on a device other than meta."""
    inputs = {
        t.untyped_storage().data_ptr()
        for t in tree_leaves((args, kwargs))
        if isinstance(t, torch.Tensor) and t.device.type != "meta"
    }
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            storage = t.untyped_storage()
            if storage.data_ptr() not in inputs:
                yield t, storage


class CreatedBytes(TorchDispatchMode):
    """Sums the bytes of every tensor a torch op creates (an output sharing no storage with
    the op's inputs) on a device other than meta, and notes the largest float32 one."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.largest_float32 = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t, storage in created_storages(args, kwargs, out):
            self.total += storage.nbytes()
            if t.dtype == torch.float32:
                self.largest_float32 = max(self.largest_float32, storage.nbytes())
        return out


@pytest.mark.parametrize("checkpoint", ["big_bf16", "big_fp8"])
def test_loading_creates_each_weight_once_in_its_dtype(request, checkpoint):
    model_dir = request.getfixturevalue(checkpoint)
    with CreatedBytes() as created:
        model, _ = load_model(model_dir, torch.bfloat16, torch.device("cpu"))
    params = module_bytes(model)
    assert created.total <= BOUND * params, (
        f"loading created {created.total / params:.2f}x the weights' bytes"
    )
    fp8 = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert bool(fp8) == (checkpoint == "big_fp8")
    for name, param in model.named_parameters():
        scale = name.endswith(("weight_scale", "input_scale"))
        expected = torch.float32 if scale else FP8 if param.dtype == FP8 else torch.bfloat16
        assert param.dtype == expected, f"{name} is {param.dtype}"
    for layer in fp8:
        assert layer.weight.dtype == FP8 and layer.scale.dtype == torch.float32
    # Computed, not loaded: RoPE frequencies stay float32 whatever the weights' dtype.
    inv_freq, _ = model.rotary._table(torch.device("cpu"))
    assert inv_freq.dtype == torch.float32
    # No float32 copy of any weight is ever made: only scales and RoPE frequencies are.
    assert created.largest_float32 <= 64 << 10


class LiveBytes(TorchDispatchMode):
    """The bytes held by the storages torch ops create (as CreatedBytes counts them) while
    they live, and the peak of that sum."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for _, storage in created_storages(args, kwargs, out):
            if storage.nbytes():
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._freed, storage.nbytes())
        return out


class CountedReads:
    """`safe_open` whose handles count the bytes of every tensor they hand out, whole
    (`get_tensor`) or sliced (`get_slice(name)[...]`), into `bytes`."""

    def __init__(self) -> None:
        self.bytes = 0

    def __call__(self, *args, **kwargs):
        return _CountedHandle(safe_open(*args, **kwargs), self)

    def handed(self, tensor: torch.Tensor) -> torch.Tensor:
        self.bytes += tensor.nbytes
        return tensor


class _CountedHandle:
    def __init__(self, handle, reads: CountedReads) -> None:
        self.handle, self.reads = handle, reads

    def __enter__(self):
        self.handle.__enter__()
        return self

    def __exit__(self, *exc):
        return self.handle.__exit__(*exc)

    def keys(self):
        return self.handle.keys()  # noqa: SIM118

    def get_tensor(self, name: str) -> torch.Tensor:
        return self.reads.handed(self.handle.get_tensor(name))

    def get_slice(self, name: str):
        return _CountedSlice(self.handle.get_slice(name), self.reads)


class _CountedSlice:
    def __init__(self, part, reads: CountedReads) -> None:
        self.part, self.reads = part, reads

    def get_shape(self):
        return self.part.get_shape()

    def __getitem__(self, index) -> torch.Tensor:
        return self.reads.handed(self.part[index])


def _tp_checkpoint(name: str, tmp_path_factory) -> Path:
    if name == "qwen3_moe, stacked":  # the published Qwen3-VL-MoE layout
        out = tmp_path_factory.mktemp("stacked") / "model"
        return stacked_experts_copy(family_checkpoint("qwen3_moe"), out)
    if name == "qwen3_moe, stacked as held":  # what transformers 5.24 writes
        out = tmp_path_factory.mktemp("held") / "model"
        return stacked_experts_copy(family_checkpoint("qwen3_moe"), out, transposed=False)
    if name in ("qwen3_moe", "qwen2_moe"):  # experts stored one by one
        return family_checkpoint(name)
    return tiny_checkpoint(name)


@pytest.mark.parametrize(
    "name",
    ["llama", "qwen2_moe", "qwen3_moe", "qwen3_moe, stacked", "qwen3_moe, stacked as held",
     "qwen3_5"],
)  # fmt: skip
def test_each_tensor_parallel_rank_reads_and_holds_its_share_alone(
    name, tmp_path_factory, monkeypatch
):
    """Each of 2 ranks reads no more than its parameters' bytes from the checkpoint, and
    holds at most those plus one parameter's worth at any time of its load; what it reads
    is its shard of the whole model's tensors (in every expert layout)."""
    model_dir = _tp_checkpoint(name, tmp_path_factory)
    cpu = torch.device("cpu")
    whole, config = load_model(model_dir, torch.float32, cpu)
    whole_params = dict(whole.named_parameters())
    for rank in range(2):
        reads = CountedReads()
        monkeypatch.setattr(loader, "safe_open", reads)
        with LiveBytes() as held:
            model, _ = load_model(model_dir, torch.float32, cpu, RankLayout(rank, 2))
        monkeypatch.undo()
        share = module_bytes(model)
        largest = max(param.nbytes for param in model.parameters())
        assert share < 0.75 * module_bytes(whole), "the rank holds a share, not the whole"
        assert reads.bytes <= share, f"rank {rank} read {reads.bytes / share:.2f}x its share"
        assert held.peak <= share + largest, (
            f"rank {rank} held {(held.peak - share) / largest:.2f} parameters' worth "
            "beyond its share"
        )
        with loader.building_in(torch.float32):
            shards = shard_decoder(build_decoder(config), config, RankLayout(rank, 2))
        for param_name, param in model.named_parameters():
            expected = whole_params[param_name]
            if param_name in shards:
                expected = shards[param_name].cut(expected)
            assert torch.equal(param, expected), f"rank {rank}: {param_name}"


def test_building_initialises_nothing_and_materializing_keeps_each_layout():
    normal = torch.nn.init.normal_
    with loader.building_in(torch.bfloat16):
        assert torch.nn.init.normal_ is not normal  # a no-op while building
        embedding = torch.nn.Embedding(4, 8)
        linear = torch.nn.Linear(8, 4, bias=False)
        linear.weight.data = torch.empty_strided((4, 8), (1, 4), device="meta")  # transposed
    assert torch.nn.init.normal_ is normal
    assert embedding.weight.is_meta and embedding.weight.dtype == torch.bfloat16
    model = loader.materialize(torch.nn.Sequential(embedding, linear), torch.device("cpu"))
    assert model[0].weight.device.type == "cpu" and model[0].weight.dtype == torch.bfloat16
    assert model[1].weight.stride() == (1, 4)
