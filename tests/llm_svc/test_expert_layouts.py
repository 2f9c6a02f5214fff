"""Stacked experts are read in whichever layout a checkpoint uses: transformers 5.24's
`save_pretrained` of Qwen3-VL-MoE writes HF's internal layout (gate_up_proj [E, 2I, H],
down_proj [E, H, I]), the published Qwen3-VL-MoE checkpoints the transposed one ([E, H, 2I],
[E, I, H]). Checked on checkpoints transformers itself writes, in both layouts, with H != 2I
and with H == 2I (where gate_up_proj's shape is the same both ways and its sibling decides),
and a shape that fits neither is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from llm_svc.engine.models.config import UnsupportedModelError
from llm_svc.engine.models.expert_weights import expert_shape, read_experts

E, TOP_K = 4, 2


def save_tiny_qwen3_vl_moe(out: Path, hidden: int, intermediate: int) -> dict[str, torch.Tensor]:
    """A one-layer Qwen3-VL-MoE saved by transformers; returns its experts as it holds them."""
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    text = dict(
        hidden_size=hidden,
        intermediate_size=64,
        moe_intermediate_size=intermediate,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_experts=E,
        num_experts_per_tok=TOP_K,
        vocab_size=64,
        rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]},
    )
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=32,
        num_heads=2,
        out_hidden_size=hidden,
        deepstack_visual_indexes=[],
    )
    torch.manual_seed(0)
    model = Qwen3VLMoeForConditionalGeneration(
        Qwen3VLMoeConfig(text_config=text, vision_config=vision)
    )
    model.save_pretrained(out)
    return {n: p.detach().clone() for n, p in model.named_parameters() if ".experts." in n}


def transposed_copy(model_dir: Path, out: Path) -> None:
    """The checkpoint with its stacked experts in the published layout."""
    tensors = load_file(model_dir / "model.safetensors")
    for name, tensor in tensors.items():
        if ".experts." in name:
            tensors[name] = tensor.transpose(1, 2).contiguous()
    out.mkdir()
    save_file(tensors, out / "model.safetensors")


def read_all(model_dir: Path, hidden: int, intermediate: int) -> dict[str, torch.Tensor]:
    """Every stacked expert tensor of the checkpoint, read as the loader reads it."""
    with safe_open(model_dir / "model.safetensors", framework="pt") as handle:
        names = set(handle.keys())  # noqa: SIM118

        def shape_of(name: str) -> tuple[int, ...]:
            return tuple(handle.get_slice(name).get_shape())

        return {
            name: read_experts(
                name,
                expert_shape(name, E, hidden, intermediate),
                names,
                handle.get_slice,
                shape_of,
            )
            for name in names
            if ".experts." in name
        }


@pytest.mark.parametrize(("hidden", "intermediate"), [(32, 24), (32, 16)], ids=["H!=2I", "H==2I"])
def test_both_stacked_layouts_read_as_transformers_holds_the_experts(
    tmp_path, hidden, intermediate
):
    held = save_tiny_qwen3_vl_moe(tmp_path / "saved", hidden, intermediate)
    assert held, "the tiny model has experts"
    # What transformers 5.24 writes: its internal layout, not the published one.
    with safe_open(tmp_path / "saved" / "model.safetensors", framework="pt") as handle:
        for name, tensor in held.items():
            assert tuple(handle.get_slice(name).get_shape()) == tuple(tensor.shape), name
            assert tensor.shape[0] == E
    transposed_copy(tmp_path / "saved", tmp_path / "published")
    for layout in ("saved", "published"):
        read = read_all(tmp_path / layout, hidden, intermediate)
        assert read.keys() == held.keys()
        for name, tensor in held.items():
            assert torch.equal(read[name], tensor), f"{layout}: {name}"


def shapes(**named: tuple[int, ...]):
    tensors = {name: torch.zeros(shape) for name, shape in named.items()}
    return tensors, tensors.__getitem__, lambda name: tuple(tensors[name].shape)


def test_a_stacked_shape_that_fits_neither_layout_is_refused_by_name():
    tensors, read, shape_of = shapes(**{"l.experts.gate_up_proj": (E, 48, 30)})
    with pytest.raises(UnsupportedModelError, match=r"l\.experts\.gate_up_proj has shape"):
        read_experts("l.experts.gate_up_proj", (E, 48, 32), tensors, read, shape_of)


def test_an_ambiguous_tensor_without_a_stacked_sibling_is_refused_by_name():
    tensors, read, shape_of = shapes(**{"l.experts.gate_up_proj": (E, 32, 32)})
    with pytest.raises(UnsupportedModelError, match=r"l\.experts\.down_proj is not stacked"):
        read_experts("l.experts.gate_up_proj", (E, 32, 32), tensors, read, shape_of)


def test_an_ambiguous_down_proj_follows_its_gate_up_proj():
    # H == I: down_proj [E, 16, 16] either way; gate_up_proj [E, H, 2I] says "transposed".
    down = torch.randn(E, 16, 16)
    tensors = {"l.experts.gate_up_proj": torch.zeros(E, 16, 32), "l.experts.down_proj": down}
    read = read_experts(
        "l.experts.down_proj",
        (E, 16, 16),
        tensors,
        tensors.__getitem__,
        lambda name: tuple(tensors[name].shape),
    )
    assert torch.equal(read, down.transpose(1, 2))
