"""``theano.config``: the flags Theano scripts read and set, with ``change_flags``.

``floatX`` defaults to ``'float64'``, as in Theano (scripts written for the GPU set float32 with
``THEANO_FLAGS=floatX=float32`` or ``config.floatX = 'float32'``). ``THEANO_FLAGS`` /
``CGVM_THEANO_FLAGS`` (``"floatX=float64,mode=FAST_COMPILE"``) are read at import. Flags that only
steer Theano's C code generation (``cxx``, ``blas.ldflags``, ``compiledir`` ...) are accepted and
ignored, so configuration code written for Theano keeps running.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Dict, Iterator

_CHOICES = {
    "floatX": ("float32", "float64", "float16"),
    "mode": ("FAST_RUN", "FAST_COMPILE", "DebugMode", "NanGuardMode", "Mode", "DEBUG_MODE", "ProfileMode"),
    "optimizer": ("fast_run", "fast_compile", "merge", "None", "o1", "o2", "o3", "o4", "unsafe"),
    "exception_verbosity": ("low", "high"),
    "compute_test_value": ("off", "ignore", "warn", "raise", "pdb"),
    "on_unused_input": ("raise", "warn", "ignore"),
}

_DEFAULTS: Dict[str, Any] = {
    "floatX": "float64",
    "device": "cpu",
    "mode": "FAST_RUN",
    "linker": "cvm",
    "optimizer": "fast_run",
    "optimizer_excluding": "",
    "optimizer_including": "",
    "allow_gc": True,
    "compute_test_value": "off",
    "exception_verbosity": "low",
    "profile": False,
    "profile_memory": False,
    "warn_float64": "ignore",
    "cast_policy": "custom",
    "on_unused_input": "raise",
    "print_active_device": True,
    "deterministic": "default",
}


class _Section:
    """A dotted flag group such as ``config.blas`` or ``config.gpuarray`` (values kept, unused)."""

    def __init__(self) -> None:
        object.__setattr__(self, "_values", {})

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        section = _Section()
        values[name] = section
        return section

    def __setattr__(self, name: str, value: Any) -> None:
        self._values[name] = value


class Config:
    """Attribute access to flags; unknown dotted sections (``config.dnn.enabled``) are tolerated."""

    def __init__(self) -> None:
        object.__setattr__(self, "_flags", dict(_DEFAULTS))
        object.__setattr__(self, "_sections", {})

    def __getattr__(self, name: str) -> Any:
        flags = object.__getattribute__(self, "_flags")
        if name in flags:
            return flags[name]
        sections = object.__getattribute__(self, "_sections")
        if name.startswith("_"):
            raise AttributeError(name)
        return sections.setdefault(name, _Section())

    def __setattr__(self, name: str, value: Any) -> None:
        choices = _CHOICES.get(name)
        if choices is not None and value not in choices:
            raise ValueError(f"config.{name} must be one of {choices}, got {value!r}")
        self._flags[name] = value

    def _set_dotted(self, key: str, value: Any) -> None:
        head, _, rest = key.partition(".")
        if not rest:
            setattr(self, head, _parse(value, self._flags.get(head)))
            return
        target: Any = getattr(self, head)
        parts = rest.split(".")
        for p in parts[:-1]:
            target = getattr(target, p)
        setattr(target, parts[-1], value)

    @contextmanager
    def change_flags(self, **flags: Any) -> Iterator[None]:
        """Set flags inside a ``with`` block, restoring them afterwards."""
        old = {k: self._flags.get(k) for k in flags}
        try:
            for k, v in flags.items():
                setattr(self, k, v)
            yield
        finally:
            self._flags.update(old)

    def __repr__(self) -> str:
        return "\n".join(f"{k} = {v!r}" for k, v in sorted(self._flags.items()))


def _parse(text: Any, like: Any) -> Any:
    if not isinstance(text, str):
        return text
    if isinstance(like, bool):
        return text.lower() in ("1", "true", "yes", "on")
    return text


config = Config()
change_flags = config.change_flags


def _read_environment() -> None:
    for var in ("THEANO_FLAGS", "CGVM_THEANO_FLAGS"):
        for item in os.environ.get(var, "").split(","):
            if "=" in item:
                key, value = item.split("=", 1)
                try:
                    config._set_dotted(key.strip(), value.strip())
                except ValueError:
                    pass  # a flag value only Theano understands: ignore it, as the C flags are


_read_environment()
