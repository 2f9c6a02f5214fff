"""Every kernel compiles for a GPU target without a GPU (ptxas ships with triton).

The interpreter runs kernel bodies as numpy; it does not catch what only the compiler
rejects (a combiner that is not a jit function, a type that does not lower). This does, for
sm_90, whatever mode triton was imported in.
"""

import sys

import pytest
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile

import iris_kernels  # noqa: F401  (loads the kernel modules)

TARGET = GPUTarget("cuda", 90, 32)
ROW_ARGS = {"D": "i32", "dest_row_stride": "i32", "src_row_stride": "i32"}


def kernel(module: str, name: str):
    return getattr(sys.modules[f"iris_kernels.{module}"], name)


CASES = {
    **{
        f"scatter_{'add_' if add else ''}rows-{dtype}": (
            kernel("scatter", "_row_kernel"),
            {"dest_ptr": f"*{dtype}", "src_ptr": f"*{dtype}", "rows_ptr": "*i64", **ROW_ARGS},
            {"BLOCK_SIZE": 2048, "ADD": add},
        )
        for dtype in ("bf16", "fp16", "fp32")
        for add in (False, True)
    },
    "checksum": (
        kernel("checksum", "_checksum_kernel"),
        {"words_ptr": "*i32", "keys_ptr": "*i64", "out_ptr": "*i64", "n": "i32"},
        {"KEY_COUNT": 16384, "BLOCK_SIZE": 2048},
    ),
}

ATTENTION_STRIDES = {
    name: "i32"
    for name in ("q_stride_t", "q_stride_h", "o_stride_t", "o_stride_h", "kv_stride_s",
                 "kv_stride_h", "table_stride")
}  # fmt: skip


def decode_case(dtype: str, head_dim: int, group: int, direct: bool):
    partial = f"*{dtype}" if direct else "*fp32"
    arguments = {
        **{f"{name}_ptr": f"*{dtype}" for name in ("q", "k", "v", "out")},
        "part_out_ptr": partial, "part_lse_ptr": partial,
        "tables_ptr": "*i64", "plan_ptr": "*i32",
        **{name: "i32" for name in ("num_seqs", "num_heads", "num_splits", "split_len")},
        **ATTENTION_STRIDES, "scale_log2": "fp32", "window": "i32",
    }  # fmt: skip
    constants = {
        "GROUP": group, "PAGE": 16, "HEAD_DIM": head_dim, "BLOCK_H": 16,
        "BLOCK_N": 64 if head_dim <= 128 else 32, "DIRECT": direct,
        "PRECISION": "ieee" if dtype == "fp32" else "tf32", "UPCAST": False,
    }  # fmt: skip
    return kernel("paged_attention_decode", "_decode_split_kernel"), arguments, constants


def extend_case(dtype: str, head_dim: int, group: int):
    block_m, block_n = sys.modules["iris_kernels.paged_attention_extend"].extend_tiles(head_dim)
    arguments = {
        **{f"{name}_ptr": f"*{dtype}" for name in ("q", "k", "v", "out")},
        "tables_ptr": "*i64", "chunks_ptr": "*i32", "blocks_ptr": "*i32", "until_ptr": "*i64",
        "num_chunks": "i32", "num_blocks": "i32", **ATTENTION_STRIDES, "scale_log2": "fp32",
        "window": "i32",
    }  # fmt: skip
    constants = {
        "GROUP": group, "PAGE": 16, "HEAD_DIM": head_dim, "BLOCK_M": block_m,
        "BLOCK_N": block_n, "PRECISION": "ieee" if dtype == "fp32" else "tf32",
        "UPCAST": False, "HAS_UNTIL": True,
    }  # fmt: skip
    return kernel("paged_attention_extend", "_extend_kernel"), arguments, constants


CASES.update(
    {
        "decode-bf16-d128-gqa4-split": decode_case("bf16", 128, 4, direct=False),
        "decode-fp32-d64-direct": decode_case("fp32", 64, 1, direct=True),
        "decode-fp16-d256-gqa8-direct": decode_case("fp16", 256, 8, direct=True),
        "decode-merge-d128": (
            kernel("paged_attention_decode", "_decode_merge_kernel"),
            {
                "out_ptr": "*bf16",
                "part_out_ptr": "*fp32",
                "part_lse_ptr": "*fp32",
                "plan_ptr": "*i32",
                "num_heads": "i32",
                "num_splits": "i32",
                "o_stride_t": "i32",
                "o_stride_h": "i32",
            },
            {"HEAD_DIM": 128, "BLOCK_S": 8},
        ),  # fmt: skip
        "extend-bf16-d128-gqa4": extend_case("bf16", 128, 4),
        "extend-fp32-d64": extend_case("fp32", 64, 1),
        "extend-fp16-d256-gqa8": extend_case("fp16", 256, 8),
    }
)


def grouped_gemm_case(dtype: str, has_scale: bool):
    arguments = {
        "x_ptr": f"*{dtype}", "w_ptr": f"*{dtype}", "out_ptr": f"*{dtype}",
        "scale_ptr": f"*{dtype}", "tile_expert_ptr": "*i64", "tile_start_ptr": "*i64",
        "tile_end_ptr": "*i64", "N": "i32", "K": "i32", "x_row_stride": "i32",
        "w_expert_stride": "i32", "w_row_stride": "i32", "w_col_stride": "i32",
        "out_row_stride": "i32",
    }  # fmt: skip
    constants = {
        "HAS_SCALE": has_scale, "PRECISION": "ieee" if dtype == "fp32" else "tf32",
        "UPCAST": False, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64,
    }  # fmt: skip
    return kernel("grouped_gemm", "_grouped_gemm_kernel"), arguments, constants


CASES.update(
    {
        "grouped-gemm-bf16-scaled": grouped_gemm_case("bf16", True),
        "grouped-gemm-fp16": grouped_gemm_case("fp16", False),
        "grouped-gemm-fp32-scaled": grouped_gemm_case("fp32", True),
    }
)


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiles_for_sm90(case, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # compile for real, not from cache
    lazy, pointers, constants = CASES[case]
    jitted = lazy.build(False)
    # A real launch takes constexpr-ness from the annotations, not from this test's table.
    assert {p.name for p in jitted.params if p.is_constexpr} == set(constants)
    assert [p.name for p in jitted.params] == [*pointers, *constants]
    signature = pointers | {name: "constexpr" for name in constants}
    source = ASTSource(fn=jitted, signature=signature, constexprs=constants)
    compiled = compile(source, target=TARGET)
    assert compiled.asm["cubin"]
    assert "st.global" in compiled.asm["ptx"]
