"""The registry of ``cgvm`` subcommands, below both the command line and the frontends.

A frontend (or any package) registers a subcommand with ``@command(name, help, add_arguments)``
without importing the command line itself; cgvm.cli builds its parser from COMMANDS.
"""
from __future__ import annotations

import argparse
from typing import Callable, Dict, Tuple

AddArguments = Callable[[argparse.ArgumentParser], None]
RunCommand = Callable[[argparse.Namespace], int]

#: name -> (help, add_arguments(parser), run(args) -> exit code)
COMMANDS: Dict[str, Tuple[str, AddArguments, RunCommand]] = {}


def command(name: str, help: str, add_arguments: AddArguments) -> Callable[[RunCommand], RunCommand]:
    """Register ``run(args) -> exit code`` as the subcommand ``name``."""
    def deco(fn: RunCommand) -> RunCommand:
        COMMANDS[name] = (help, add_arguments, fn)
        return fn
    return deco
