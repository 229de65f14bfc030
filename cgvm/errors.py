"""Exceptions cgvm raises for user mistakes; each names where the user wrote the offending thing."""
from __future__ import annotations

from typing import Optional


def at_source(source: Optional[str]) -> str:
    """`` (at SOURCE)`` for where the user wrote something, or nothing when that is unknown."""
    return f" (at {source})" if source else ""


def apply_policy(policy: str, message: str, error: type, stacklevel: int = 2) -> None:
    """A user's choice for a questionable but legal request (Theano's ``on_unused_input``,
    ``disconnected_inputs``): "raise" raises ``error(message)``, "warn" warns (``stacklevel`` as
    seen from the caller), anything else ("ignore") lets it pass."""
    if policy == "raise":
        raise error(message)
    if policy == "warn":
        import warnings

        warnings.warn(message, stacklevel=stacklevel + 1)


def where(*, pc: Optional[int] = None, instr: Optional[str] = None, name: Optional[str] = None,
          op: Optional[str] = None, source: Optional[str] = None) -> str:
    """The one format of "where" in cgvm's messages: ``pc 3: <instruction>, node 'fc1' op matmul
    (at net.prototxt:12 (layer fc1))``; each part only when known."""
    parts = []
    if pc is not None:
        parts.append(f"pc {pc}: {instr}" if instr else f"pc {pc}")
    named = " ".join(([f"node {name!r}"] if name else []) + ([f"op {op}"] if op else []))
    if named:
        parts.append(named)
    return ", ".join(parts) + at_source(source)


class CgvmError(Exception):
    """Base of every error cgvm raises on purpose."""


class GraphBuildError(CgvmError):
    """A node could not be built: unknown op, bad attribute, wrong input count."""


class ShapeError(GraphBuildError):
    """Input shapes or dtypes of a node do not fit its op."""


class DTypeError(ShapeError):
    """A dtype does not fit where it is used."""


class VerifyError(CgvmError):
    """A graph breaks an IR invariant (found by the verifier)."""


class SerializationError(CgvmError):
    """A graph cannot be saved (an attribute value has no serialized form, the graph is not closed)
    or data cannot be loaded (corrupt, truncated, written by a newer cgvm, unknown op)."""


class GradientError(CgvmError):
    """A gradient was requested that cannot be built (disconnected, non-differentiable)."""


class MissingInputError(CgvmError):
    """A value the outputs depend on is neither an input, a parameter nor a constant."""


class UnusedInputError(CgvmError):
    """An input that no output depends on (only raised when the user asks for it)."""


class InputError(CgvmError):
    """Arguments given to a compiled function do not fit its inputs."""


class ExecutionError(CgvmError):
    """A kernel failed at run time; the message carries the instruction and the node's source."""


class IndexOutOfBoundsError(ExecutionError, IndexError):
    """A kernel was given an index outside its tensor (also an IndexError, as NumPy and Theano raise)."""


class BackendUnavailable(CgvmError):
    """The requested backend cannot be used here (library or device missing)."""


class WorkspaceError(CgvmError, KeyError):
    """A named tensor is missing from the workspace or does not fit."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the message as written
        return str(self.args[0]) if self.args else ""


class ConfigError(CgvmError):
    """A setting (an environment variable, a command-line value) cannot be understood."""


class ResourceLimitError(CgvmError):
    """A file or definition asks for more memory than the configured limit (CGVM_MAX_BYTES)."""


class LoadError(CgvmError):
    """A file cannot be loaded; nothing was changed. Names the file and the part at fault."""


class LoadTimeout(LoadError):
    """Reading a file did not finish in time (a library call that never returned was stopped)."""


class DistributedError(CgvmError):
    """Data-parallel training cannot go on: MPI missing, ranks disagree, a peer rank failed or timed out."""
