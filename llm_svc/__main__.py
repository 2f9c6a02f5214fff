"""`python -m llm_svc` = `iris llm`."""

import typer

from llm_svc.cli import command

if __name__ == "__main__":
    typer.run(command)
