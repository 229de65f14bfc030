"""Fuzz targets for cgvm's own graph files (``cgvm.ir.load_graph``): binary protobuf and ``.pbtxt`` text.

Seeds are graphs built with the core API and saved with ``save_graph``: elementwise chains,
parameters and constants of several dtypes, a gradient, a ``cond`` and a ``scan`` (sub-graphs),
and a Caffe LeNet deploy net. Loading returns a new Graph and writes nowhere; the target checks
that a failed load left the op table and the default Workspace as they were.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, List

import numpy as np

from fuzz.target import PartialLoad, Target


def _graphs() -> List[Any]:
    import cgvm
    from cgvm.ir import Graph, TensorType, apply, input_value, param_value
    from cgvm.ir.graph import const_value
    from cgvm.ir.opschema import OPS
    from cgvm.ops import elementwise as E
    from cgvm.ops import reduce as R

    f32 = lambda *s: TensorType(list(s), "float32")  # noqa: E731
    x = input_value(TensorType([None, 4], "float32"), "x")
    y = input_value(f32(4), "y")
    chain = Graph([x, y], [E.relu(E.tanh(E.mul(E.add(x, y), E.exp(E.neg(y)))), negative_slope=0.25)], name="chain")

    x2 = input_value(f32(2, 3), "x")
    w = param_value("w", f32(3))
    c = const_value(np.arange(6, dtype=np.uint8).reshape(2, 3))
    m = const_value(np.array([True, False, True]))
    leaves = Graph([x2], [E.add(E.mul(x2, w), E.cast(c, dtype="float32")), E.mul(E.cast(m, dtype="float32"), x2),
                          R.sum(x2, axis=1, keepdims=True)], name="leaves")

    xg = input_value(TensorType([None, 3], "float64"), "xg")
    wg = param_value("wg", TensorType([3], "float64"))
    cost = R.sum(E.tanh(E.mul(xg, wg)))
    grads = Graph([xg], [cost, cgvm.grad(cost, wg)], name="grads")

    a = input_value(f32(3), "a")
    b = input_value(f32(3), "b")
    pred = input_value(TensorType([], "bool"), "p")
    xc = input_value(f32(3), "xc")
    yc = apply(OPS["cond"], [pred, xc], {"then_graph": Graph([a], [E.exp(a)], name="then"),
                                          "else_graph": Graph([b], [E.neg(b)], name="else")})
    cond = Graph([pred, xc], [yc], name="cond")

    xt, hp, u = input_value(f32(3), "xt"), input_value(f32(3), "hp"), input_value(f32(3), "u")
    ht = E.tanh(E.add(xt, E.mul(hp, u)))
    body = Graph([xt, hp, u], [ht, E.mul(ht, ht)], name="rnn")
    X, h0, U = input_value(TensorType([None, 3], "float32"), "X"), input_value(f32(3), "h0"), input_value(f32(3), "U")
    scan = Graph([X, h0, U], list(apply(OPS["scan"], [X, h0, U], {"body": body, "n_seqs": 1, "n_carry": 1})),
                 name="scan")
    out = [chain, leaves, grads, cond, scan]
    try:
        from cgvm.frontends.caffe import graph_from_prototxt

        root = Path(__file__).resolve().parents[3]
        out.append(graph_from_prototxt(str(root / "models" / "lenet" / "lenet_deploy.prototxt"), "TEST"))
    except Exception:
        pass
    return out


def _seeds(text: bool):
    def seeds(tmp: Path) -> List[bytes]:
        from cgvm.ir import save_graph

        out = []
        for i, g in enumerate(_graphs()):
            p = tmp / (f"g{i}.pbtxt" if text else f"g{i}.cgvm")
            save_graph(g, p)
            out.append(p.read_bytes())
        return out
    return seeds


def _state() -> Any:
    from cgvm.ir.opschema import OPS
    from cgvm.vm import default_workspace

    return (len(OPS), tuple(sorted(OPS)), tuple(sorted(default_workspace().keys())))


def _load(path: Path) -> Any:
    from cgvm.ir import load_graph

    before = _state()
    try:
        return load_graph(path)
    except BaseException as exc:
        if _state() != before:
            raise PartialLoad("a failed load_graph changed the op table or the default workspace") from exc
        raise


def targets() -> List[Target]:
    return [Target("graph file (binary) -> cgvm.ir.load_graph", ".cgvm", _seeds(False), _load),
            Target("graph file (.pbtxt) -> cgvm.ir.load_graph", ".pbtxt", _seeds(True), _load)]
