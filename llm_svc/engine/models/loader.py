"""Load the language model's weights from a local HF directory (plain LM or inside a VLM).

The LM's prefix is found from where `embed_tokens.weight` sits (`model.` for a plain LM,
`model.text_model.` for Idefics3, `model.language_model.` for Qwen2-VL in transformers 5);
`lm_head.weight` is looked up at the top level and beside that prefix. Under tensor
parallelism each rank reads only its shard of each tensor (safetensors' `get_slice`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from iris.models.fp8 import FP8, SCALE_NAMES, dequantize, quantized_modules
from llm_svc.engine.models.decoder import DecoderLM
from llm_svc.engine.models.expert_weights import (
    STACKED_SCALES,
    expert_shape,
    is_stacked_expert,
    read_expert_scales,
    read_experts,
)
from llm_svc.engine.models.quantization import swap_fp8_experts, swap_fp8_linears
from llm_svc.engine.models.shard import Shard

log = logging.getLogger(__name__)

_EMBED = "embed_tokens.weight"


def _tensor_files(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    return files


def find_text_prefix(names: list[str]) -> str:
    """The prefix under which the language model's decoder lives in a checkpoint."""
    candidates = sorted(name[: -len(_EMBED)] for name in names if name.endswith(_EMBED))
    if not candidates:
        raise ValueError("checkpoint has no embed_tokens.weight: not a supported language model")
    return min(candidates, key=len)


@contextmanager
def building_in(dtype: torch.dtype) -> Iterator[None]:
    """Build modules with no memory behind them, in their target dtype: inside, any
    nn.Module constructed (and any layer swapped in) lands on the meta device with `dtype`
    as torch's default float dtype; `materialize` then allocates it once. A tensor given an
    explicit dtype keeps it (FP8 weights, float32 scales). torch's default dtype is
    process-wide: building is not meant to overlap other work in the process."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"), _no_init():
            yield
    finally:
        torch.set_default_dtype(previous)


# torch.nn.init's in-place initialisers. On the meta device they compute nothing the
# weights will keep, yet `normal_` there (every nn.Embedding) goes through torch's
# reference decompositions and imports torch._dynamo: about 2 s of a pod's start.
_INITIALISERS = (
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
    "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
    "orthogonal_", "sparse_",
)  # fmt: skip


@contextmanager
def _no_init() -> Iterator[None]:
    """Inside, torch.nn.init's initialisers leave their tensor as it is."""
    saved = {name: getattr(nn.init, name) for name in _INITIALISERS}
    try:
        for name in saved:
            setattr(nn.init, name, _leave_as_is)
        yield
    finally:
        for name, function in saved.items():
            setattr(nn.init, name, function)


def _leave_as_is(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return tensor


def materialize(model: nn.Module, device: torch.device) -> nn.Module:
    """Allocate `model`'s (meta) parameters and buffers on `device`, each once, in the dtype
    it was built in; the values (buffers too) are uninitialised until the weights are
    loaded."""
    # What `to_empty` does, but `torch.empty_strided` rather than `empty_like`: the latter,
    # from a meta tensor, runs torch's reference implementation, whose imports (sympy, the
    # symbolic-shape machinery) cost half a second of every start. Strides are kept
    # (lay_out_for_cpu's transposed weights).
    return model._apply(
        lambda tensor: torch.empty_strided(
            tensor.size(), tensor.stride(), dtype=tensor.dtype, device=device
        )
    )


def swap_quantized_layers(
    model: DecoderLM, model_dir: str | Path, dtype: torch.dtype, device: torch.device
) -> None:
    """Before loading: make each decoder linear the checkpoint stores in FP8 an FP8 layer
    (a no-op for an unquantized checkpoint). The new layers are built where the old ones
    are (the meta device while `building_in`); `device` is where they will run, which
    decides their matmul."""
    scheme = model.config.quantization
    if scheme is None:
        return
    names: list[str] = []
    for path in _tensor_files(Path(model_dir)):
        with safe_open(path, framework="pt") as handle:
            names.extend(handle.keys())  # noqa: SIM118
    prefix = find_text_prefix(names)
    quantized = {
        name[len(prefix) :]
        for name in quantized_modules(names, scheme)
        if name.startswith(prefix + "layers.")
    }
    counts = swap_fp8_linears(model, scheme, quantized, device, dtype)
    counts["expert blocks"] = swap_fp8_experts(model, scheme, quantized)
    log.info("FP8 (%s, %s scales): %s linear layers", scheme.method, scheme.strategy, counts)


def load_weights(
    model: DecoderLM, model_dir: str | Path, shards: dict | None = None, prefix: str | None = None
) -> None:
    """Copy every parameter of `model` from the checkpoint; a missing one is an error.

    An FP8 layer of `model` (llm_svc/engine/models/quantization.py) takes the FP8 weight and
    its scales as stored; a plain parameter stored in FP8 with a scale (an lm_head, say) is
    dequantized to the model's dtype; an FP8 tensor with no scale is an error.
    `shards[name]`, when given, is a tensor-parallel rank's Shard of parameter `name`
    (models/shard.py): only that part of the checkpoint's tensor is read, and allocated at
    most once (tensor parallelism refuses quantized checkpoints, so the two never meet).
    `prefix`, when given, is where `model`'s parameters sit in the checkpoint instead of
    the language model's prefix (`mtp.` for Qwen3.5's MTP layer, llm_svc/engine/spec/mtp.py)."""
    model_dir = Path(model_dir)
    files = _tensor_files(model_dir)
    where: dict[str, Path] = {}
    for path in files:
        with safe_open(path, framework="pt") as handle:
            where.update({name: path for name in handle.keys()})  # noqa: SIM118
    prefix_given = prefix is not None
    prefix = find_text_prefix(list(where)) if prefix is None else prefix
    lm_head_names = ["lm_head.weight", prefix + "lm_head.weight"]
    if prefix.endswith("model."):
        lm_head_names.append(prefix[: -len("model.")] + "lm_head.weight")
    params = dict(model.named_parameters())
    wanted: dict[str, str] = {}
    for name in params:
        if name == "lm_head.weight":
            found = next((n for n in lm_head_names if n in where), None)
            if found is None:
                raise ValueError(f"no lm_head weight in {model_dir} (tried {lm_head_names})")
            wanted[found] = name
        else:
            wanted[prefix + name] = name
    skipped = sum(name.startswith("mtp.") for name in where)
    if skipped and not prefix_given:
        # Multi-token prediction (Qwen3.5): loaded on their own, and only when the engine
        # drafts with them (speculative_method "mtp", llm_svc/engine/spec/mtp.py).
        log.info("%d mtp.* weights (multi-token prediction) left to the MTP drafter", skipped)
    # Stacked experts may be stored per expert: read_experts finds them (checked there).
    missing = [name for name in wanted if name not in where and not is_stacked_expert(name)]
    if missing:
        raise ValueError(f"{len(missing)} weights missing from {model_dir}, e.g. {missing[:3]}")
    scheme = model.config.quantization
    with ExitStack() as stack:
        handles = {path: stack.enter_context(safe_open(path, framework="pt")) for path in files}

        def read(name: str) -> torch.Tensor:
            return handles[where[name]].get_tensor(name)

        def open_slice(name: str):
            return handles[where[name]].get_slice(name)

        def shape_of(name: str) -> tuple[int, ...]:
            return tuple(open_slice(name).get_shape())

        def read_param(stored: str, shard: Shard | None) -> torch.Tensor:
            """The checkpoint's tensor `stored`, or only its `shard` (only that is read)."""
            if stored.endswith(STACKED_SCALES):
                return read_expert_scales(stored, model.config.moe.num_experts, where, read)
            if is_stacked_expert(stored):
                # The whole shape: under tensor parallelism the parameter is one rank's.
                moe, hidden = model.config.moe, model.config.hidden_size
                whole = expert_shape(stored, moe.num_experts, hidden, moe.intermediate_size)
                return read_experts(stored, whole, where, open_slice, shape_of, shard)
            if shard is None:
                return read(stored)
            try:
                return shard.cut(open_slice(stored))
            except ValueError as err:
                raise ValueError(f"{stored}: {err}") from None

        with torch.no_grad():
            for stored, target_name in wanted.items():
                target = params[target_name]
                tensor = read_param(stored, (shards or {}).get(target_name))
                if tensor.dtype == FP8 and target.dtype != FP8:
                    tensor = _dequantized(stored, tensor, scheme, where, read)
                elif target.dtype == FP8 and tensor.dtype != FP8:
                    raise ValueError(f"{stored} has a scale but is stored as {tensor.dtype}")
                elif (
                    tensor.shape != target.shape
                    and _is_scale(stored)
                    and tensor.numel() == target.numel()
                ):
                    # Scales are stored as [], [1], [out] or [out, 1]: same values.
                    tensor = tensor.reshape(target.shape)
                if tensor.shape != target.shape:
                    raise ValueError(
                        f"{stored}: shape {tuple(tensor.shape)} in checkpoint, "
                        f"model expects {tuple(target.shape)}"
                    )
                target.copy_(tensor)  # casts to the parameter's dtype, no copy in between
                del tensor  # before the next is read: one tensor's worth at a time


def _is_scale(name: str) -> bool:
    return name.rpartition(".")[2] in SCALE_NAMES


def _dequantized(stored, tensor, scheme, where, read) -> torch.Tensor:
    scale_name = None if scheme is None else stored[: -len("weight")] + scheme.scale_name
    if scale_name is None or scale_name not in where or not stored.endswith(".weight"):
        raise ValueError(
            f"{stored} is stored in FP8 but the checkpoint has no quantization_config scale "
            f"for it ({scale_name or 'no quantization_config'})"
        )
    return dequantize(tensor, read(scale_name), scheme)
