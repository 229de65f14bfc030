"""Name registries for Keras objects (initializers, losses, layers...) and their config dicts.

Keras 3 serializes an object as ``{"module", "class_name", "config", "registered_name"}``; tf.keras 2
as ``{"class_name", "config"}``; both also accept a bare string (``"glorot_uniform"``).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from ...errors import CgvmError


class KerasConfigError(CgvmError, ValueError):
    """A Keras config (or model file) names something this frontend does not know or cannot use."""


_custom_objects: Dict[str, Any] = {}


def register_keras_serializable(package: str = "Custom", name: Optional[str] = None) -> Callable[[Any], Any]:
    """Decorator: make a custom class loadable from a saved config by its (package-qualified) name."""
    def deco(cls: Any) -> Any:
        key = name or cls.__name__
        _custom_objects[f"{package}>{key}"] = cls
        _custom_objects[key] = cls
        return cls
    return deco


def custom_objects() -> Dict[str, Any]:
    return _custom_objects


def accepted_args(cls: Any, config: Dict[str, Any]) -> Dict[str, Any]:
    """``config`` without the keys ``cls`` does not take (newer Keras versions add some, e.g. input_axes)."""
    import inspect

    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return config
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return config
    return {k: v for k, v in config.items() if k in params}


class Registry:
    """Classes under their class name and snake_case aliases."""

    def __init__(self, kind: str):
        self.kind = kind
        self.classes: Dict[str, Any] = {}

    def register(self, *aliases: str) -> Callable[[Any], Any]:
        def deco(cls: Any) -> Any:
            self.classes[cls.__name__] = cls
            for a in aliases:
                self.classes[a] = cls
            return cls
        return deco

    def lookup(self, name: str, extra: Optional[Dict[str, Any]] = None) -> Any:
        for table in (extra or {}, _custom_objects, self.classes):
            if name in table:
                return table[name]
        raise KerasConfigError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self.classes))}")

    def get(self, identifier: Any, extra: Optional[Dict[str, Any]] = None) -> Any:
        if identifier is None:
            return None
        if isinstance(identifier, str):
            return self.lookup(identifier, extra)()
        if isinstance(identifier, dict):
            cls = self.lookup(identifier.get("registered_name") or identifier["class_name"], extra)
            config = accepted_args(cls, dict(identifier.get("config") or {}))
            return cls.from_config(config) if hasattr(cls, "from_config") else cls(**config)
        return identifier

    def serialize(self, obj: Any, module: str) -> Any:
        if obj is None:
            return None
        name = type(obj).__name__
        return {"module": module, "class_name": name, "config": obj.get_config(), "registered_name": None}
