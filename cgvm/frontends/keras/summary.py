"""``model.summary()`` in Keras 3's table format (box drawing; a "Connected to" column for functional models)."""
from __future__ import annotations

from typing import Any, Callable, List, Optional

from .layers.base import InputLayer


def _size(n_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n_bytes < 1024 or unit == "GB":
            return f"{n_bytes:.2f} {unit}"
        n_bytes /= 1024.0
    return f"{n_bytes:.2f} GB"


def _shape(layer: Any) -> str:
    try:
        shape = layer.output_shape
    except AttributeError:
        return "?"
    if isinstance(shape, list):
        return ", ".join(str(tuple(s)) for s in shape)
    return str(tuple(shape))


def _cell(text: str, width: int, right: bool = False) -> str:
    text = text if len(text) <= width - 2 else text[:width - 3] + "…"
    return " " + (text.rjust(width - 2) if right else text.ljust(width - 2)) + " "


def print_summary(model: Any, line_length: Optional[int] = None, print_fn: Optional[Callable[..., Any]] = None,
                  show_trainable: bool = False) -> None:
    from .models import Functional, Sequential

    functional = isinstance(model, Functional) and not isinstance(model, Sequential)
    widths = [33, 24, 15] if not functional else [31, 22, 11, 20]
    heads = ["Layer (type)", "Output Shape", "Param #"] + (["Connected to"] if functional else [])
    rows: List[List[str]] = []
    for layer in model.layers:
        if isinstance(layer, InputLayer) and not functional:
            continue
        row = [f"{layer.name} ({type(layer).__name__})", _shape(layer), f"{layer.count_params():,}"]
        if functional:
            sources = []
            for node in layer._inbound_nodes:
                if any(node is n for n in getattr(model, "_nodes", [])):
                    for t in node.input_tensors:
                        if t._keras_history:
                            src, ni, ti = t._keras_history
                            sources.append(f"{src.name}[{ni}][{ti}]")
            row.append(", ".join(sources) if sources else "-")
        rows.append(row)

    def line(left: str, mid: str, right: str, fill: str) -> str:
        return left + mid.join(fill * w for w in widths) + right

    out = [f'Model: "{model.name}"', line("┏", "┳", "┓", "━"),
           "┃" + "┃".join(_cell(h, w, right=(h == "Param #")) for h, w in zip(heads, widths)) + "┃",
           line("┡", "╇", "┩", "━")]
    for i, row in enumerate(rows):
        out.append("│" + "│".join(_cell(c, w, right=(k == 2)) for k, (c, w) in enumerate(zip(row, widths))) + "│")
        out.append(line("├", "┼", "┤", "─") if i + 1 < len(rows) else line("└", "┴", "┘", "─"))
    if not rows:
        out.append(line("└", "┴", "┘", "─"))
    total = model.count_params()
    trainable = sum(int(__import__("numpy").prod(w.shape)) for w in model.trainable_weights)
    out.append(f" Total params: {total:,} ({_size(total * 4)})")
    out.append(f" Trainable params: {trainable:,} ({_size(trainable * 4)})")
    out.append(f" Non-trainable params: {total - trainable:,} ({_size((total - trainable) * 4)})")
    if getattr(model, "optimizer", None) is not None and model.optimizer._slots:
        n_opt = sum(int(__import__("numpy").prod(v.shape)) for v in model.optimizer.variables)
        out.append(f" Optimizer params: {n_opt:,} ({_size(n_opt * 4)})")
    text = "\n".join(out)
    (print_fn or print)(text)
