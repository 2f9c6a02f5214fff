"""Every kernel compiles for a GPU target without a GPU (ptxas ships with triton).

The interpreter runs kernel bodies as numpy; it does not catch what only the compiler
rejects (a combiner that is not a jit function, a type that does not lower). This does, for
sm_90, whatever mode triton was imported in.
"""

import sys

import pytest
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile

import kernels  # noqa: F401  (loads the kernel modules)

TARGET = GPUTarget("cuda", 90, 32)
ROW_ARGS = {"D": "i32", "dest_row_stride": "i32", "src_row_stride": "i32"}


def kernel(module: str, name: str):
    return getattr(sys.modules[f"kernels.{module}"], name)


CASES = {
    **{
        f"scatter_rows-{dtype}": (
            kernel("scatter", "_scatter_rows_kernel"),
            {"dest_ptr": f"*{dtype}", "src_ptr": f"*{dtype}", "rows_ptr": "*i64", **ROW_ARGS},
            {"BLOCK_SIZE": 2048},
        )
        for dtype in ("bf16", "fp16", "fp32")
    },
    "checksum": (
        kernel("checksum", "_checksum_kernel"),
        {"words_ptr": "*i32", "keys_ptr": "*i64", "out_ptr": "*i64", "n": "i32"},
        {"KEY_COUNT": 16384, "BLOCK_SIZE": 2048},
    ),
}


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
