"""Exceptions cgvm raises for user mistakes; each names where the user wrote the offending thing."""
from __future__ import annotations


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
