"""`iris models ...`: build the tiny test checkpoints and the demo checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from iris.models.build import TINY_ARCHS

app = typer.Typer(
    help="Build local model checkpoints (nothing is downloaded).", no_args_is_help=True
)


@app.command("make-tiny")
def make_tiny(
    out_dir: Annotated[
        Path, typer.Argument(help="Directory to create (kept if already complete).")
    ],
    arch: Annotated[
        str, typer.Option("--arch", help=f"Family: {', '.join(TINY_ARCHS)}.")
    ] = "qwen2_vl",
) -> None:
    """A tiny random checkpoint (hidden 64, 2 layers, real tokenizer; the VLMs with a small
    vision tower)."""
    if arch not in TINY_ARCHS:
        raise typer.BadParameter(
            f"{arch!r} is not one of: {', '.join(TINY_ARCHS)}", param_hint="--arch"
        )
    from iris.models.build import make_tiny as build

    typer.echo(str(build(arch, out_dir)))


@app.command("make-demo")
def make_demo(
    out_dir: Annotated[
        Path, typer.Argument(help="Directory to create (kept if already complete).")
    ],
    full_resolution: Annotated[
        bool,
        typer.Option(
            "--full-resolution",
            help="SmolVLM's published image settings (longest edge 2048: up to 17 tiles an "
            "image) instead of one 512-pixel tile.",
        ),
    ] = False,
) -> None:
    """SmolVLM-256M-Instruct's architecture: the real SmolLM2-135M-Instruct language model
    with a random SigLIP-base vision tower and connector. It chats sensibly; its image
    understanding is not meaningful, its vision cost is real."""
    from iris.models.demo import make_demo as build

    typer.echo(str(build(out_dir, full_resolution=full_resolution)))
