"""The declared pipeline: graph passes and per-signature stages as lists of Pass records, needs
resolved as TVM resolves ``required``, and --print-after limited to known passes and to what changed."""
import io

import numpy as np
import pytest

import cgvm
from cgvm.compiler import PIPELINE, SIGNATURE_STAGES, generate, prepare_signature, run_passes, stage_names
from cgvm.compiler.passes import Pass, run_pipeline, select
from cgvm.ir import Graph, TensorType, input_value
from cgvm.ir.types import float32
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R


def test_both_lists_hold_the_same_records_and_declare_earlier_needs_only():
    for pipeline in (PIPELINE, SIGNATURE_STAGES):
        seen = set()
        for p in pipeline:
            assert isinstance(p, Pass) and p.doc
            assert set(p.needs) <= seen, p.name
            seen.add(p.name)
    assert stage_names() == ["slot_types", "specialize", "plan_memory", "plan_updates"]


def test_a_selected_pass_brings_what_it_needs_in_pipeline_order():
    assert [p.name for p in select(PIPELINE, ["fuse"])] == ["prune", "fold", "cse", "simplify", "epilogues", "fuse"]
    assert [p.name for p in select(SIGNATURE_STAGES, ["specialize"])] == ["slot_types", "specialize"]
    with pytest.raises(ValueError, match="unknown pass 'nope'"):
        select(PIPELINE, ["nope"])
    trace = []
    record = [Pass("a", lambda s: s + "a"), Pass("b", lambda s: s + "b", ("a",)), Pass("c", lambda s: s + "c")]
    assert run_pipeline("", record, ["b"], after=lambda p, s: trace.append((p.name, s))) == "ab"
    assert trace == [("a", "a"), ("b", "ab")]


def test_signature_stages_give_types_program_and_plan():
    x = input_value(TensorType((None, 3), float32), "x")
    y = R.sum(R.sum_to_like(E.exp(x), x))   # sum_to_like is an identity once shapes are known
    program = generate(run_passes(Graph([x], [y])))
    known = {program.input_slots[0]: TensorType((2, 3), float32)}
    sig = prepare_signature(program, known)
    assert sig.types[program.input_slots[0]].shape == (2, 3) and sig.plan is not None
    assert "sum_to_like" not in [sig.program.nodes[i.node].op.name for i in sig.program.instrs if i.opcode == "CALL"]
    assert prepare_signature(program, known, plan=False).plan is None


def test_print_after_shows_the_first_whole_then_only_what_changed():
    x = input_value(TensorType((4,), float32), "x")
    g = Graph([x], [E.add(E.exp(x), E.exp(x))])
    buf = io.StringIO()
    run_passes(g, print_after=["prune", "fold", "cse"], out=buf)
    text = buf.getvalue()
    assert "// after prune\ngraph" in text
    assert "// after fold: no change" in text
    after_cse = text.split("// after cse: ")[1]
    assert after_cse.startswith("3 lines removed, 2 written:") and "add(%1, %1)" in after_cse
    assert "exp(" not in after_cse   # the first exp is unchanged, so not printed again
    with pytest.raises(ValueError, match="unknown pass 'fusion'.*prune, fold"):
        run_passes(g, print_after=["fusion"])


def test_the_command_line_takes_only_known_passes_and_lists_them(capsys):
    from cgvm.cli import main

    with pytest.raises(SystemExit):
        main(["compile", "m.cgvm", "--print-after", "prune,bogus"])
    assert "unknown pass 'bogus'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    assert "epilogues, fuse, schedule, collectives, or all" in " ".join(capsys.readouterr().out.split())


def test_a_function_runs_the_stages_per_signature():
    x = input_value(TensorType((None,), float32), "x")
    f = cgvm.compile([x], E.exp(x))
    f(np.zeros(3, np.float32))
    f(np.zeros(5, np.float32))
    assert len(f.memory_plans()) == 2


def test_one_liveness_analysis_serves_the_planner_report_and_update_plan():
    from cgvm.compiler.liveness import liveness
    from cgvm.ir import param_value
    from cgvm.ops import linalg as L

    x = input_value(TensorType((2, 3), float32), "x")
    w = param_value("w", TensorType((3, 3), float32))
    y = R.sum(L.matmul(E.exp(x), w))
    new_w = E.sub(w, E.mul(cgvm.grad(y, w), 0.5))
    program = generate(run_passes(Graph([x], [y, new_w])))
    live = liveness(program)
    assert live is liveness(program)   # computed once per program
    w_slot = program.param_slots[0][1]
    assert live.is_external(w_slot) and live.is_external(program.output_slots[0])
    known = {program.input_slots[0]: TensorType((2, 3), float32), w_slot: TensorType((3, 3), float32)}
    sig = prepare_signature(program, known, recyclable=(1,))
    assert sig.updates.recycled == {sig.program.output_slots[1]: 0}
    assert sig.updates.in_place == {w_slot: 0}   # w - 0.5 * g may overwrite w's own array
    assert prepare_signature(program, known).updates.recycled == {}


def _training_step_graph(blocks=12, batch=8, width=6):
    """A loss over tanh(x W + b) blocks and its gradients (the graph recomputation works on)."""
    from cgvm.ir import param_value
    from cgvm.ops import elementwise_math as EM
    from cgvm.ops import linalg as L
    from cgvm.ops import loss as LS

    x = input_value(TensorType((batch, width), float32), "x")
    y = input_value(TensorType((batch,), "int64"), "y")
    params, h = [], x
    for i in range(blocks):
        w, b = param_value(f"W{i}", TensorType((width, width), float32)), param_value(f"b{i}", TensorType((width,)))
        params += [w, b]
        h = EM.tanh(E.add(L.matmul(h, w), b))
    loss = LS.softmax_cross_entropy(h, y)
    return Graph([x, y], [loss] + cgvm.grad(loss, params))


def test_recomputation_is_the_last_pass_and_runs_only_when_asked_for():
    from cgvm.compiler.recompute import Recomputation, plan_recompute

    last = PIPELINE[-1]
    assert (last.name, last.option, last.needs) == ("recompute", "recompute", ("prune",))
    assert "recompute" not in [p.name for p in select(PIPELINE, None)]
    assert "recompute" not in [p.name for p in select(PIPELINE, ["recompute", "fold"])]   # named, not asked for
    asked = [p.name for p in select(PIPELINE, ["fold"], {"recompute": "sqrt"})]
    assert asked == ["prune", "fold", "recompute"]
    graph = _training_step_graph()
    plain = run_passes(graph)
    request = Recomputation("sqrt")
    buf = io.StringIO()
    rebuilt = run_passes(graph, recompute=request, print_after=["recompute"], out=buf)
    assert rebuilt is request.plan.graph and request.plan.duplicated_nodes > 0
    # the same as recomputing the optimized graph by hand
    assert str(rebuilt) == str(plan_recompute(plain, "sqrt").graph)
    assert buf.getvalue().startswith("// after recompute\n") and "/recompute" in buf.getvalue()
    assert str(run_passes(graph, recompute=None)) == str(plain)


def test_the_command_line_runs_the_recompute_pass_when_asked(tmp_path, capsys):
    from cgvm.cli import main
    from cgvm.ir.serialize import save_graph

    path = tmp_path / "step.cgvm"
    save_graph(_training_step_graph(), path)
    assert main(["compile", str(path), "--recompute", "sqrt", "--print-after", "schedule,recompute"]) == 0
    out = capsys.readouterr().out
    after = out.split("// after recompute: ")[1]
    assert out.startswith("// after schedule\n") and "/recompute" in after and "/recompute" not in out.split(
        "// after recompute")[0]
    with pytest.raises(SystemExit):
        main(["compile", str(path), "--print-after", "recompute"])
    assert "runs only with --recompute sqrt" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    assert "recompute (compile --recompute)" in " ".join(capsys.readouterr().out.split())
