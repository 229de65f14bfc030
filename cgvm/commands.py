"""The registry of ``cgvm`` subcommands, below both the command line and the frontends.

A frontend (or any package) registers a subcommand with ``@command(name, help, add_arguments)``
without importing the command line itself; cgvm.cli builds its parser from COMMANDS.
"""
from __future__ import annotations

import argparse
from typing import Callable, Dict, Tuple

from .errors import CgvmError

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


class UsageError(CgvmError):
    """A command-line value that does not fit: the command line prints it with the command's usage."""


WEIGHT_SUFFIXES = (".caffemodel", ".caffemodel.h5", ".solverstate", ".solverstate.h5", ".binaryproto")


def refuse_weights_file(path: str, what: str = "a model") -> None:
    """A trained-weights or state file given where a net definition is expected: say so."""
    if str(path).endswith(WEIGHT_SUFFIXES):
        raise UsageError(f"{path} holds trained weights or a solver state, not a net; give {what} "
                         "(a .prototxt net definition or a .cgvm graph) here, and the weights with --weights")
