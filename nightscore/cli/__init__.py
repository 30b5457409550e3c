"""The nightscore command line (the top floor): `main` returns a command line's exit code, `entrypoint` exits with it."""

from nightscore.cli.entry import entrypoint, main

__all__ = ["entrypoint", "main"]
