"""`python -m encoder_svc` = `iris encoder`."""

import typer

from encoder_svc.cli import command

if __name__ == "__main__":
    typer.run(command)
