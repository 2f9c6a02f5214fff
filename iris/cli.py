"""The `iris` command line. Each service package contributes its subcommand from its own
`cli.py`, which must not import heavy modules at import time."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    help="Iris: serve vision-language models on Kubernetes.",
    no_args_is_help=True,
    add_completion=False,
    # Services write to log files and container logs: plain tracebacks, not boxes.
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """Iris: serve vision-language models on Kubernetes."""


# (subcommand, module, attribute): a function becomes a command, a Typer app a group.
SUBCOMMANDS = [
    ("up", "iris.up.cli", "command"),
    ("models", "iris.models.cli", "app"),
    ("cache", "embedding_cache_svc.cli", "command"),
    ("encoder", "encoder_svc.cli", "command"),
    ("llm", "llm_svc.cli", "command"),
    ("gateway", "gateway.cli", "command"),
    ("operator", "operators.cli", "command"),
]


def _register() -> None:
    for name, module_name, attribute in SUBCOMMANDS:
        target = getattr(importlib.import_module(module_name), attribute)
        if isinstance(target, typer.Typer):
            app.add_typer(target, name=name)
        else:
            app.command(name)(target)


@app.command("version")
def version() -> None:
    """Print the Iris version."""
    from importlib.metadata import version as package_version

    typer.echo(package_version("iris"))


_register()

if __name__ == "__main__":
    app()
