"""Saving and loading graphs (cgvm.ir.serialize, proto/cgvm.proto).

Round trips are checked generically: a graph and its saved-and-loaded copy must print the same
text, be structurally the same (``graph_difference``: kinds, names, types, constants, attributes,
sources, node order) and, compiled with ``cgvm.compile``, compute the same arrays. The graphs:

* hand-written ones below (chains, reductions, params and constants of every dtype, gradients,
  control flow, names and sources, every attribute kind through an IR-only op);
* every Case of every op table in tests/ops/test_*.py, forward and gradient graphs, so new op
  families are covered as soon as their tables exist;
* one graph per registered op that no Case covers, where generic inputs fit it.

tests/conftest.py also round-trips every graph compiled anywhere in the suite. Files, corrupt
data and graphs that cannot be saved are in test_serialize_errors.py.
"""
from __future__ import annotations

import functools
import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import pytest

import cgvm
from cgvm.errors import CgvmError
from cgvm.ir import (Graph, OpSchema, TensorType, apply, graph_from_proto, graph_to_proto, input_value,
                     param_value, source_scope)
from cgvm.ir import cgvm_pb2 as pb
from cgvm.ir import serialize
from cgvm.ir.attrs import Any_, Array, Bool, DTypeAttr, Float, Floats, GraphAttr, Int, Ints, Str, attr_key
from cgvm.ir.graph import const_value
from cgvm.ir.opschema import OPS
from cgvm.ir.serialize import graph_difference
from cgvm.ops import all_ops
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R
from cgvm.ops import shape as S

TESTS_DIR = Path(__file__).resolve().parents[1]
OP_TESTS_DIR = TESTS_DIR / "ops"


# ============================================================================ checking a round trip


def through_bytes(graph: Graph) -> Graph:
    data = graph_to_proto(graph).SerializeToString()
    return graph_from_proto(pb.GraphProto.FromString(data))


def _stateful(graph: Graph) -> bool:
    for node in graph.nodes:
        if getattr(node.op, "stateful", False):
            return True
        if any(isinstance(a, Graph) and _stateful(a) for a in node.attrs.values()):
            return True
    return False


def run(graph: Graph, feeds: Sequence[np.ndarray], params: Optional[Dict[str, np.ndarray]] = None) -> list:
    ws = cgvm.Workspace("numpy")
    for name, value in (params or {}).items():
        ws.set(name, value)
    f = cgvm.compile(list(graph.inputs), list(graph.outputs), workspace=ws, name=graph.name)
    out = f(*[np.array(a, copy=True) for a in feeds])
    return [np.asarray(o) for o in (out if isinstance(out, list) else [out])]


def check_roundtrip(graph: Graph, feeds: Optional[Sequence[np.ndarray]] = None,
                    params: Optional[Dict[str, np.ndarray]] = None) -> Graph:
    """Save and load ``graph``; the copy must print, compare and (given feeds) compute the same."""
    copy = through_bytes(graph)
    assert str(copy) == str(graph)
    diff = graph_difference(graph, copy)
    assert diff is None, diff
    cgvm.ir.verify(copy)
    if feeds is not None and not _stateful(graph):
        want = run(graph, feeds, params)
        got = run(copy, feeds, params)
        for i, (w, g) in enumerate(zip(want, got)):
            assert w.dtype == g.dtype and w.shape == g.shape, f"output {i}"
            np.testing.assert_array_equal(g, w, err_msg=f"{graph.name}: output {i} of the loaded graph")
    return copy


# ============================================================================ hand-written graphs

rng = np.random.default_rng(7)


def f32(*shape):
    return TensorType(shape, "float32")


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


class Example(NamedTuple):
    graph: Graph
    feeds: Optional[List[np.ndarray]] = None
    params: Optional[Dict[str, np.ndarray]] = None


def ex_elementwise_chain() -> Example:
    x = input_value(TensorType([None, 4], "float32"), "x")
    y = input_value(f32(4), "y")
    z = E.relu(E.tanh(E.mul(E.add(x, y), E.exp(E.neg(y)))), negative_slope=0.25)
    return Example(Graph([x, y], [z], name="chain"), [randn(3, 4), randn(4)])


def ex_reductions() -> Example:
    x = input_value(TensorType([2, None, 5], "float32"), "x")
    kept = R.sum(x, axis=2, keepdims=True)
    outs = [R.sum(x), R.sum(x, axis=(0, -1), keepdims=True), R.sum(x, axis=1), S.squeeze(kept, axis=-1)]
    return Example(Graph([x], outs, name="reductions"), [randn(2, 3, 5)])


def ex_params_and_constants() -> Example:
    x = input_value(f32(2, 3), "x")
    w = param_value("w", f32(3))
    b = param_value("bias", TensorType([2, 1], "float64"))
    mask = const_value(np.array([True, False, True]))
    scale = const_value(np.arange(6, dtype=np.uint8).reshape(2, 3))
    big = const_value(np.linspace(-1, 1, 24).reshape(2, 3, 4))  # float64, more than the printer shows
    i64 = const_value(np.array(-(2 ** 40), np.int64))
    y = E.add(E.mul(x, w), b)
    outs = [y, E.mul(E.cast(mask, dtype="float32"), x), E.mul(x, E.cast(scale, dtype="float32")),
            R.sum(big, axis=2), E.add(E.cast(x, dtype="int64"), i64), mask]
    return Example(Graph([x], outs, name="leaves"), [randn(2, 3)],
                   {"w": randn(3), "bias": randn(2, 1, dtype=np.float64)})


def ex_gradients() -> Example:
    x = input_value(TensorType([None, 3], "float64"), "x")
    w = param_value("w", TensorType([3], "float64"))
    cost = R.sum(E.tanh(E.mul(E.relu(E.mul(x, w), negative_slope=0.1), w)))
    gw, gx = cgvm.grad(cost, [w, x])
    ggw = cgvm.grad(R.sum(E.mul(gw, gw)), w)  # a second derivative: gradient nodes of gradient nodes
    return Example(Graph([x], [cost, gw, gx, ggw], name="grads"), [randn(4, 3, dtype=np.float64)],
                   {"w": randn(3, dtype=np.float64)})


def ex_names_and_sources() -> Example:
    x = input_value(f32(3), "data")
    with source_scope("lenet.prototxt:12 (layer conv1)"):
        h = E.exp(x, name="conv1")
    h.name = "conv1_top"  # a frontend names a value (a Caffe top, a Theano variable)
    y = E.neg(h, name="")
    no_source = E.tanh(y)
    no_source.node.source = None
    empty_source = E.exp(no_source)
    empty_source.node.source = ""
    return Example(Graph([x], [empty_source, h], name="named"), [randn(3)])


def ex_outputs_that_are_leaves() -> Example:
    x = input_value(f32(2), "x")
    w = param_value("w", f32(2))
    c = const_value(np.array([1.5, 2.5], np.float32))
    return Example(Graph([x], [x, w, c, E.add(x, c), x], name="leaves_out"), [randn(2)], {"w": randn(2)})


def ex_pruned_at_an_intermediate_value() -> Example:
    x = input_value(f32(2), "x")
    h = E.exp(x)
    y = E.tanh(h)
    g = cgvm.compiler.prune(Graph([x], [y]), given=[h])  # h becomes an input although a node computed it
    return Example(Graph([h], list(g.outputs), name="pruned"), [randn(2)])


def ex_shared_leaves() -> Example:
    x = input_value(f32(2), "x")
    c = const_value(np.float32(3.0))
    w = param_value("w", f32(2))
    y = E.add(E.mul(E.mul(x, w), w), E.mul(c, c))
    return Example(Graph([x], [y, E.add(y, c)], name="shared"), [randn(2)], {"w": randn(2)})


def ex_cond() -> Example:
    a = input_value(f32(3), "a")
    then_graph = Graph([a], [E.exp(a)], name="then")
    b = input_value(f32(3), "b")
    else_graph = Graph([b], [E.neg(b)], name="else")
    pred = input_value(TensorType([], "bool"), "p")
    x = input_value(f32(3), "x")
    y = apply(OPS["cond"], [pred, x], {"then_graph": then_graph, "else_graph": else_graph})
    g = cgvm.grad(R.sum(y), x)
    return Example(Graph([pred, x], [y, g], name="cond"), [np.array(True), randn(3)])


def ex_scan() -> Example:
    xt, hp, u = input_value(f32(3), "xt"), input_value(f32(3), "hp"), input_value(f32(3), "u")
    ht = E.tanh(E.add(xt, E.mul(hp, u)))
    body = Graph([xt, hp, u], [ht, E.mul(ht, ht)], name="rnn")
    X = input_value(TensorType([None, 3], "float32"), "X")
    h0, U = input_value(f32(3), "h0"), input_value(f32(3), "U")
    outs = apply(OPS["scan"], [X, h0, U], {"body": body, "n_seqs": 1, "n_carry": 1})
    gU = cgvm.grad(R.sum(outs[-1]), U)
    return Example(Graph([X, h0, U], list(outs) + [gU], name="scan"), [randn(4, 3), randn(3), randn(3)])


EXAMPLES: Dict[str, Callable[[], Example]] = {
    f.__name__[3:]: f for f in (ex_elementwise_chain, ex_reductions, ex_params_and_constants, ex_gradients,
                                 ex_names_and_sources, ex_outputs_that_are_leaves,
                                 ex_pruned_at_an_intermediate_value, ex_shared_leaves,
                                 ex_cond, ex_scan)}


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_roundtrip_examples(name):
    example = EXAMPLES[name]()
    check_roundtrip(example.graph, example.feeds, example.params)


def test_kinds_names_types_and_sources_survive():
    example = ex_params_and_constants()
    copy = check_roundtrip(example.graph)
    assert [v.kind for v in copy.inputs] == ["input"]
    assert [p.name for p in copy.params] == ["w", "bias"]
    assert copy.params[1].type == TensorType([2, 1], "float64")
    named = check_roundtrip(ex_names_and_sources().graph)
    exp_node, neg_node, tanh_node, last = named.nodes
    assert exp_node.name == "conv1" and exp_node.source == "lenet.prototxt:12 (layer conv1)"
    assert exp_node.outputs[0].name == "conv1_top" and named.outputs[1] is exp_node.outputs[0]
    assert neg_node.name == "" and tanh_node.source is None and last.source == ""
    pruned = check_roundtrip(ex_pruned_at_an_intermediate_value().graph)
    assert pruned.inputs[0].kind == "node" and pruned.inputs[0].node is None


def test_constants_and_parameters_may_be_graph_inputs():
    c = const_value(np.ones(2, np.float32))
    w = param_value("w", f32(2))
    copy = check_roundtrip(Graph([c, w], [E.add(c, w)], name="fed"))  # structure only: what runs is the VM's say
    assert [v.kind for v in copy.inputs] == ["const", "param"]


def test_identity_of_leaves_is_kept():
    copy = check_roundtrip(ex_shared_leaves().graph)
    mul_cc = next(n for n in copy.nodes if n.inputs[0] is n.inputs[1] and n.inputs[0].kind == "const")
    assert mul_cc.op.name == "mul"  # c * c still reads one constant
    x = input_value(f32(2), "x")
    w1, w2 = param_value("w", f32(2)), param_value("w", f32(2))  # two Values, one Workspace entry
    copy = check_roundtrip(Graph([x], [E.mul(E.mul(x, w1), w2)]))
    assert len({id(v) for n in copy.nodes for v in n.inputs if v.kind == "param"}) == 2
    assert len(copy.params) == 1


def test_loaded_nodes_are_rebuilt_through_the_builder():
    example = ex_gradients()
    copy = through_bytes(example.graph)
    originals = {id(n) for n in example.graph.nodes}
    assert not any(id(n) in originals for n in copy.nodes)
    for node in copy.nodes:
        assert node.attrs == node.op.check_attrs(dict(node.attrs))  # checked, defaults filled


# ---------------------------------------------------------------------------- every attribute kind

ATTR_OP = "_test_serialize_attrs"


@pytest.fixture
def attr_op():
    """An IR-only op (no kernel, so it is never compiled) with an attribute of every kind."""
    op = OpSchema(ATTR_OP, num_inputs=(1, None), infer=lambda types, **_: types[0], attrs={
        "i": Int(0), "f": Float(0.0), "b": Bool(False), "s": Str("same", choices=("same", "valid")),
        "ints": Ints(()), "floats": Floats(()), "dtype": DTypeAttr(None), "table": Array(None),
        "body": GraphAttr(None), "any": Any_(None), "opt_int": Int(None)})
    yield op
    del OPS[op.name]


def _body(depth: int) -> Graph:
    a = input_value(TensorType([None], "float32"), "a")
    out = E.tanh(a)
    if depth:
        out = apply(OPS[ATTR_OP], [out], {"body": _body(depth - 1), "i": depth})
    return Graph([a], [out], name=f"body{depth}")


ATTR_VALUES = [
    {},
    {"i": -7, "f": 2.5, "b": True, "s": "valid"},
    {"i": 2 ** 62, "f": float("inf")},
    {"f": float("nan")},
    {"f": -0.0, "ints": (3, -1, 0), "floats": (0.5, 1e-300, -2.0)},
    {"ints": 4, "floats": 1},
    {"dtype": "int8"},
    {"dtype": "bool", "table": np.arange(12, dtype=np.float64).reshape(3, 4)},
    {"table": np.array([True, False])},
    {"table": np.zeros((0, 3), np.int16)},
    {"table": np.array(3.5, np.float16)},
    {"table": np.arange(6, dtype=">i4")},  # big-endian in memory: saved little-endian, loaded native
    {"table": np.array([1 + 2j], np.complex128)},
    {"any": ((1, 1), (2, 2))},
    {"any": (1, 2.5, "pad", None, True, (), ("a", ("b", (None,))))},
    {"any": ()},
    {"any": ("x", "y")},
    {"any": (float("nan"), 1.0)},
    {"any": "just a string"},
    {"any": np.int64(5)},
    {"opt_int": 3},
    {"body": "nested"},
]


@pytest.mark.parametrize("attrs", ATTR_VALUES, ids=lambda a: ",".join(a) or "defaults")
def test_every_attribute_kind_survives(attr_op, attrs):
    attrs = dict(attrs)
    if attrs.get("body") == "nested":
        attrs["body"] = _body(2)  # a sub-graph whose node holds a sub-graph
    x = input_value(TensorType([None, 2], "float32"), "x")
    y = apply(attr_op, [x], attrs, name="n", source="attrs.py:1")
    graph = Graph([x], [y], name="attrs")
    copy = check_roundtrip(graph)
    for key, value in y.node.attrs.items():
        loaded = copy.nodes[0].attrs[key]
        if isinstance(value, np.ndarray):
            assert loaded.dtype == value.dtype.newbyteorder("=") and loaded.shape == value.shape
            np.testing.assert_array_equal(loaded, value)
            assert not loaded.flags.writeable
        elif isinstance(value, Graph):
            assert isinstance(loaded, Graph) and loaded is not value
        else:  # attr_key: what CSE compares (NaN equal to NaN)
            assert attr_key(loaded) == attr_key(value) and type(loaded) is type(value), key


def test_attribute_kinds_in_the_proto(attr_op):
    x = input_value(f32(2), "x")
    y = apply(attr_op, [x], {"ints": (1, 2), "floats": (1.0,), "any": ((1, 1), ("a", "b"), ()), "dtype": "int32"})
    attrs = graph_to_proto(Graph([x], [y])).nodes[0].attrs
    assert attrs["ints"].WhichOneof("value") == "ints" and list(attrs["ints"].ints.values) == [1, 2]
    assert attrs["floats"].WhichOneof("value") == "floats"
    assert attrs["dtype"].dtype == "int32"
    assert attrs["body"].WhichOneof("value") == "none"
    pads = attrs["any"].tuple.values
    assert [v.WhichOneof("value") for v in pads] == ["ints", "strings", "tuple"]
    assert attrs["i"].WhichOneof("value") == "i" and attrs["b"].WhichOneof("value") == "b"


# ============================================================================ every Case of every op table


class Harvested(NamedTuple):
    module: str
    case: Any


def _import_op_test_module(path: Path):
    """The op test module, imported once: the module pytest made of it, or as pytest would make it
    (tests/ops on sys.path, the file's stem as the name) if pytest has not collected it yet."""
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve() == path:
            return module
    if str(OP_TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(OP_TESTS_DIR))
    return importlib.import_module(path.stem)


def _is_case(obj: Any) -> bool:
    return type(obj).__name__ == "Case" and callable(getattr(obj, "build", None)) and hasattr(obj, "inputs")


@functools.lru_cache(maxsize=None)
def harvested_cases() -> Tuple[Harvested, ...]:
    """Every Case object in a list or tuple at the top level of tests/ops/test_*.py, once each."""
    found: List[Harvested] = []
    seen: set = set()
    for path in sorted(OP_TESTS_DIR.glob("test_*.py")):
        try:
            module = _import_op_test_module(path.resolve())
        except Exception:  # a broken op test module is reported by its own collection
            continue
        for value in vars(module).values():
            if isinstance(value, (list, tuple)):
                for case in value:
                    if _is_case(case) and id(case) not in seen:
                        seen.add(id(case))
                        found.append(Harvested(path.stem, case))
    return tuple(found)


def _case_ids() -> List[str]:
    ids, counts = [], {}
    for h in harvested_cases():
        base = f"{h.module[5:]}::{h.case.name}"
        counts[base] = counts.get(base, 0) + 1
        ids.append(base if counts[base] == 1 else f"{base}#{counts[base]}")
    return ids


def _symbolic(inputs: Sequence[np.ndarray], dynamic: bool) -> list:
    return [input_value(TensorType([None] * a.ndim if dynamic else a.shape, a.dtype), f"in{i}")
            for i, a in enumerate(inputs)]


def _as_list(x: Any) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def case_graph(case: Any) -> Example:
    """The forward graph of a Case, as tests/ops/harness.check_case builds it."""
    feeds = [np.array(a, copy=True) for a in case.inputs]
    syms = _symbolic(feeds, case.dynamic)
    return Example(Graph(syms, _as_list(case.build(*syms)), name=case.name), feeds)


def case_gradient_graph(case: Any) -> Example:
    """Cost and gradients of a Case in float64, as tests/ops/harness.check_grad differentiates it."""
    feeds = [a.astype(np.float64) if a.dtype.kind == "f" else np.array(a, copy=True) for a in case.inputs]
    syms = _symbolic(feeds, case.dynamic)
    outs = [o for o in _as_list(case.build(*syms)) if o.dtype.is_float]
    which = case.grad_inputs if case.grad_inputs is not None else \
        [i for i, a in enumerate(feeds) if a.dtype.kind == "f"]
    cost = None
    for o in outs:
        term = R.sum(E.mul(o, o))
        cost = term if cost is None else E.add(cost, term)
    grads = cgvm.grad(cost, [syms[i] for i in which], disconnected_inputs="ignore")
    return Example(Graph(syms, [cost] + list(grads), name=f"{case.name}_grad"), feeds)


def _built(make: Callable[[Any], Example], case: Any) -> Example:
    try:
        return make(case)
    except (CgvmError, TypeError, ValueError, KeyError, IndexError) as exc:
        pytest.skip(f"the case does not build here ({type(exc).__name__}: {exc}); its own test reports it")


# cases of inf and NaN make NumPy warn; the op's own tests decide about that
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("harvested", harvested_cases(), ids=_case_ids())
def test_roundtrip_op_case(harvested):
    example = _built(case_graph, harvested.case)
    check_roundtrip(example.graph, example.feeds)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("harvested", [h for h in harvested_cases() if getattr(h.case, "grad", False)],
                         ids=[i for h, i in zip(harvested_cases(), _case_ids()) if getattr(h.case, "grad", False)])
def test_roundtrip_op_case_gradient(harvested):
    example = _built(case_gradient_graph, harvested.case)
    check_roundtrip(example.graph, example.feeds)


# ============================================================================ every registered op


def _ops_in(graph: Graph) -> Iterator[str]:
    for node in graph.nodes:
        yield node.op.name
        for a in node.attrs.values():
            if isinstance(a, Graph):
                yield from _ops_in(a)


@functools.lru_cache(maxsize=None)
def covered_ops() -> frozenset:
    """Names of the ops in some graph the tests above round-trip."""
    names: set = set()
    makers: List[Callable[[], Example]] = list(EXAMPLES.values())
    makers += [functools.partial(case_graph, h.case) for h in harvested_cases()]
    makers += [functools.partial(case_gradient_graph, h.case) for h in harvested_cases() if h.case.grad]
    for make in makers:
        try:
            names.update(_ops_in(make().graph))
        except (Exception, pytest.skip.Exception):  # counted as not covered; the test itself reports why
            continue
    return frozenset(names)


def _ops_cgvm_registers() -> frozenset:
    """The ops a fresh ``import cgvm`` registers (not the ones tests declare for themselves)."""
    code = "import cgvm\nfrom cgvm.ops import all_ops\nprint(' '.join(sorted(all_ops())))"
    env = dict(os.environ, PYTHONPATH=str(TESTS_DIR.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], cwd=TESTS_DIR.parent, env=env, capture_output=True,
                          text=True, timeout=300, check=True)
    return frozenset(done.stdout.split())


def test_every_op_cgvm_registers_has_a_case_in_an_op_table():
    """Each op is built by the forward or gradient graph of some Case in tests/ops/test_*.py, so its
    kernel is checked against NumPy (and its gradient numerically) rather than only round-tripped."""
    in_cases: set = set()
    for h in harvested_cases():
        makers = [case_graph] + ([case_gradient_graph] if getattr(h.case, "grad", False) else [])
        for make in makers:
            try:
                in_cases.update(_ops_in(make(h.case).graph))
            except Exception:  # noqa: BLE001  (a case that does not build is reported by its own test)
                continue
    missing = sorted(_ops_cgvm_registers() - in_cases)
    assert not missing, f"ops in no Case of tests/ops (add one to a CASES table): {missing}"


GENERIC_SHAPES = [(2, 3), (2, 3, 4, 5), (6,), ()]


def generic_graph(op: Any) -> Optional[Example]:
    """A graph of one node of ``op`` with default attributes on float32 inputs, if any shape fits."""
    lo, hi = op.num_inputs
    for shape in GENERIC_SHAPES:
        for n in sorted({lo, max(lo, 1), max(lo, 2)}):
            if hi is not None and n > hi:
                continue
            syms = [input_value(f32(*shape), f"in{i}") for i in range(n)]
            try:
                outs = apply(op, syms, {}, source="generic")
            except Exception:  # build errors, and rules that fail on inputs they never expect
                continue
            feeds = [randn(*shape) for _ in syms]
            return Example(Graph(syms, _as_list(outs), name=f"generic_{op.name}"), feeds)
    return None


@pytest.mark.parametrize("opname", sorted(all_ops()))
def test_every_registered_op_round_trips(opname):
    if opname in covered_ops():
        return  # a round trip above has a node of this op
    example = generic_graph(all_ops()[opname])
    if example is None:
        pytest.skip(f"no Case in tests/ops builds op {opname!r} and generic float32 inputs do not fit it")
    try:
        run(example.graph, example.feeds)
    except Exception:  # its kernel wants other values; the structure still has to survive
        example = example._replace(feeds=None)
    check_roundtrip(example.graph, example.feeds)


# ============================================================================ the comparison the tests rely on


def test_graph_difference_finds_what_a_round_trip_could_lose():
    def two():
        x = input_value(f32(3), "x")
        with source_scope("s.py:1"):
            y = E.relu(E.add(x, np.float32(1.0)), negative_slope=0.5, name="r")
        return Graph([x], [y], name="g")

    assert graph_difference(two(), two()) is None
    a = two()
    b = two()
    b.nodes[1].source = "s.py:2"
    assert graph_difference(a, b) == ("graph 'g': node #1 (node 'r' op relu (at s.py:1)): name 'r' and source "
                                      "'s.py:2' in the copy")
    b = two()
    b.nodes[1].attrs = {"negative_slope": 0.25}
    assert "attribute 'negative_slope'" in graph_difference(a, b)
    b = two()
    b.nodes[0].inputs[1].data = np.array(2.0, np.float32)
    assert "constant data" in graph_difference(a, b)
    b = two()
    b.inputs[0].name = "y"
    assert "input 0" in graph_difference(a, b)
    b = two()
    b.nodes[0].inputs = (b.nodes[0].inputs[1], b.nodes[0].inputs[0])
    assert "input 0" in graph_difference(a, b)


# ============================================================================ the suite-wide check


def test_conftest_round_trips_every_compiled_graph(monkeypatch):
    if os.environ.get("CGVM_TEST_ROUNDTRIP") == "0":
        pytest.skip("the save/load check of compiled graphs is off (CGVM_TEST_ROUNDTRIP=0)")

    x = input_value(f32(2), "x")
    cgvm.compile([x], [E.exp(x)])  # passes the check
    monkeypatch.setattr(serialize, "graph_difference", lambda a, b: "a difference planted by this test")
    with pytest.raises(pytest.fail.Exception, match="planted by this test"):
        cgvm.compile([x], [E.exp(x)], name="checked")
