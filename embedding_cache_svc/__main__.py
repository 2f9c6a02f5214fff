"""`python -m embedding_cache_svc` = `iris cache`."""

import typer

from embedding_cache_svc.cli import command

if __name__ == "__main__":
    typer.run(command)
