"""Errors of the Caffe frontend: each says which file, line and layer, and what to do about it."""
from __future__ import annotations

from cgvm.errors import CgvmError


class CaffeError(CgvmError):
    """Base of every error the Caffe frontend raises on purpose."""


class CaffeParseError(CaffeError):
    """A Caffe file (prototxt, caffemodel, binaryproto, solverstate) cannot be read.

    `filename`, `line` and `column` (1-based) say where, when known; `source_line` is the text of
    that line. `str()` gives `file:line:column: message`, the quoted line with a caret under the
    column, and a hint when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        filename: str | None = None,
        line: int | None = None,
        column: int | None = None,
        source_line: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.filename = filename
        self.line = line
        self.column = column
        self.source_line = source_line
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        where = self.filename or "<string>"
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        parts = [f"{where}: {self.message}"]
        if self.source_line is not None and self.line is not None:
            gutter = f"{self.line:>5} | "
            text = self.source_line.expandtabs(1)  # one column per character, as protobuf counts
            parts.append(gutter + text)
            if self.column is not None:
                parts.append(" " * (len(gutter) - 2) + "| " + " " * (self.column - 1) + "^")
        if self.hint:
            parts.append(self.hint)
        return "\n".join(parts)

    def __str__(self) -> str:
        return self._render()


class CaffeUpgradeError(CaffeParseError):
    """A legacy (V0, V1, `input_dim`, `solver_type`) definition cannot be upgraded as Caffe does."""


class CaffeNetError(CaffeError):
    """A net definition is well-formed text but breaks one of Caffe's rules (filters, blob wiring)."""


class CaffeUpgradeWarning(UserWarning):
    """Caffe would log an error and continue while upgrading a legacy definition; so do we."""
