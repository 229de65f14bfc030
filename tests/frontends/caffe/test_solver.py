"""Caffe solvers: every update rule and lr policy against values computed here by hand (NumPy),
iter_size, clipping, lr_mult/decay_mult, snapshot + restore continuing bit-identically, and the
pycaffe anchors (iter counts, apply_update, snapshot file names)."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

from cgvm.frontends.caffe import solver as S  # noqa: E402
from cgvm.frontends.caffe.errors import CaffeError  # noqa: E402
from cgvm.frontends.caffe.prototxt import parse_solver_text, read_solver_state  # noqa: E402
from cgvm.frontends.caffe.solver_updates import learning_rate  # noqa: E402

RNG = np.random.default_rng(7)
X = RNG.standard_normal((4, 3)).astype(np.float32)
Y = RNG.standard_normal((4, 1)).astype(np.float32)

NET = """
name: "least_squares"
layer {{ name: "data" type: "HDF5Data" top: "data" top: "targets"
        hdf5_data_param {{ source: "{source}" batch_size: {batch} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        param {{ lr_mult: 1 decay_mult: 1 }} param {{ lr_mult: 2 decay_mult: 0 }}
        inner_product_param {{ num_output: 1 weight_filler {{ type: "gaussian" std: 1 }}
                               bias_filler {{ type: "gaussian" std: 1 }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "targets" top: "loss" }}
"""


def make_solver(tmp_path, kind="SGD", batch=4, extra="", cls=None, **kwargs):
    h5 = tmp_path / "data.h5"
    if not h5.exists():
        with h5py.File(h5, "w") as f:
            f["data"], f["targets"] = X, Y
        (tmp_path / "list.txt").write_text(f"{h5}\n")
    net = tmp_path / f"net_{batch}.prototxt"
    net.write_text(NET.format(source=tmp_path / "list.txt", batch=batch))
    defaults = {"base_lr": "0.1", "lr_policy": '"fixed"', "max_iter": "100", "random_seed": "3"}
    given = {line.split(":")[0].strip() for line in extra.splitlines() if line.strip()}
    text = (f'net: "{net}"\ntype: "{kind}"\nsnapshot_prefix: "{tmp_path / "snap"}"\n'
            + "".join(f"{k}: {v}\n" for k, v in defaults.items() if k not in given) + extra)
    path = tmp_path / f"solver_{kind}.prototxt"
    path.write_text(text)
    if cls is not None:
        return cls(str(path), log=False, **kwargs)
    return S.get_solver(str(path), log=False, **kwargs)


def weights(solver):
    ws = solver.net.workspace
    return np.array(ws["ip/0"], np.float64).copy(), np.array(ws["ip/1"], np.float64).copy()


def gradients(w, b, x=X, y=Y):
    """d/dw, d/db of EuclideanLoss = sum((x w^T + b - y)^2) / (2 N)."""
    r = x.astype(np.float64) @ w.T + b - y
    return r.T @ x / len(x), r.sum(0) / len(x)


def reference_steps(kind, w, b, steps, *, lr=0.1, momentum=0.0, momentum2=0.999, decay=0.0, delta=1e-8,
                    rms_decay=0.99, clip=-1.0, l1=False):
    """The solver update written out in NumPy from caffe_facts.md §6.3 (lr_mult 1/2, decay_mult 1/0)."""
    hist = [[np.zeros_like(w), np.zeros_like(b)] for _ in range(2)]
    params = [w, b]
    for t in range(steps):
        grads = list(gradients(*params))
        if clip >= 0:
            norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
            if norm > clip:
                grads = [g * clip / norm for g in grads]
        for i, (mult_lr, mult_decay) in enumerate(((1.0, 1.0), (2.0, 0.0))):
            p, g = params[i], grads[i]
            if decay * mult_decay:
                g = g + decay * mult_decay * (np.sign(p) if l1 else p)
            rate = lr * mult_lr
            h, u = hist[0][i], hist[1][i]
            if kind == "SGD":
                h = momentum * h + rate * g
                step = h
            elif kind == "Nesterov":
                prev = h
                h = momentum * h + rate * g
                step = (1 + momentum) * h - momentum * prev
            elif kind == "AdaGrad":
                h = h + g * g
                step = rate * g / (np.sqrt(h) + delta)
            elif kind == "RMSProp":
                h = rms_decay * h + (1 - rms_decay) * g * g
                step = rate * g / (np.sqrt(h) + delta)
            elif kind == "AdaDelta":
                h = momentum * h + (1 - momentum) * g * g
                step0 = g * np.sqrt((u + delta) / (h + delta))
                u = momentum * u + (1 - momentum) * step0 * step0
                step = rate * step0
            elif kind == "Adam":
                m = momentum * h + (1 - momentum) * g
                v = momentum2 * u + (1 - momentum2) * g * g
                h, u = m, v
                step = rate * math.sqrt(1 - momentum2 ** (t + 1)) / (1 - momentum ** (t + 1)) * m / (np.sqrt(v) + delta)
            hist[0][i], hist[1][i] = h, u
            params[i] = p - step
    return params


CASES = [
    ("SGD", "momentum: 0.9\nweight_decay: 0.01\n", dict(momentum=0.9, decay=0.01)),
    ("SGD", "weight_decay: 0.05\nregularization_type: \"L1\"\n", dict(decay=0.05, l1=True)),
    ("Nesterov", "momentum: 0.9\nweight_decay: 0.01\n", dict(momentum=0.9, decay=0.01)),
    ("AdaGrad", "weight_decay: 0.01\ndelta: 1e-6\n", dict(decay=0.01, delta=1e-6)),
    ("RMSProp", "rms_decay: 0.95\n", dict(rms_decay=0.95)),
    ("AdaDelta", "momentum: 0.95\ndelta: 1e-6\nbase_lr: 1.0\n", dict(momentum=0.95, delta=1e-6, lr=1.0)),
    ("Adam", "momentum: 0.9\nmomentum2: 0.999\n", dict(momentum=0.9)),
    ("SGD", "momentum: 0.5\nclip_gradients: 0.1\n", dict(momentum=0.5, clip=0.1)),
]


@pytest.mark.parametrize("kind,extra,ref", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_update_rules_match_hand_computed(tmp_path, kind, extra, ref):
    solver = make_solver(tmp_path, kind, extra=extra)
    assert type(solver) is S.SOLVERS[kind]
    w0, b0 = weights(solver)
    solver.step(3)
    w, b = weights(solver)
    ew, eb = reference_steps(kind, w0, b0, 3, **ref)
    np.testing.assert_allclose(w, ew, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(b, eb, rtol=2e-5, atol=1e-6)
    assert solver.iter == 3


def test_iter_size_equals_one_big_batch(tmp_path):
    big = make_solver(tmp_path, "SGD", batch=4, extra="momentum: 0.9\nweight_decay: 0.01\n")
    split = make_solver(tmp_path, "SGD", batch=2, extra="momentum: 0.9\nweight_decay: 0.01\niter_size: 2\n")
    for name in ("ip/0", "ip/1"):
        split.workspace[name][...] = big.workspace[name]
    big.step(3)
    split.step(3)
    for name in ("ip/0", "ip/1"):
        np.testing.assert_allclose(split.workspace[name], big.workspace[name], rtol=1e-5, atol=1e-6)


def _param(text):
    return parse_solver_text(text)


@pytest.mark.parametrize("text,iteration,expected", [
    ('base_lr: 0.1 lr_policy: "fixed"', 37, 0.1),
    ('base_lr: 0.1 lr_policy: "step" gamma: 0.5 stepsize: 10', 25, 0.1 * 0.5 ** 2),
    ('base_lr: 0.1 lr_policy: "exp" gamma: 0.9', 3, 0.1 * 0.9 ** 3),
    ('base_lr: 0.01 lr_policy: "inv" gamma: 0.0001 power: 0.75', 100, 0.01 * (1 + 0.0001 * 100) ** -0.75),
    ('base_lr: 0.1 lr_policy: "poly" power: 2 max_iter: 100', 40, 0.1 * (1 - 0.4) ** 2),
    ('base_lr: 0.1 lr_policy: "sigmoid" gamma: -0.1 stepsize: 50', 60, 0.1 / (1 + math.exp(0.1 * 10))),
])
def test_lr_policies(text, iteration, expected):
    rate, _ = learning_rate(_param(text), iteration, 0)
    assert rate == pytest.approx(expected, rel=1e-6)


def test_multistep_advances_one_step_per_call():
    param = _param('base_lr: 1 lr_policy: "multistep" gamma: 0.1 stepvalue: 2 stepvalue: 4')
    step, rates = 0, []
    for it in range(6):
        rate, step = learning_rate(param, it, step)
        rates.append(rate)
    assert rates == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01], rel=1e-6)
    # jumping straight to iteration 10 moves one step per call, as Caffe's counter does
    assert learning_rate(param, 10, 0) == (pytest.approx(0.1, rel=1e-6), 1)


def test_unknown_policy_and_bad_settings(tmp_path):
    with pytest.raises(CaffeError, match="unknown lr_policy 'cosine'"):
        learning_rate(_param('base_lr: 1 lr_policy: "cosine"'), 0, 0)
    with pytest.raises(CaffeError, match="momentum cannot be used with AdaGrad"):
        make_solver(tmp_path, "AdaGrad", extra="momentum: 0.9\n")


@pytest.mark.parametrize("kind,fmt", [("SGD", "BINARYPROTO"), ("Adam", "BINARYPROTO"), ("AdaDelta", "HDF5"),
                                      ("Nesterov", "HDF5")])
def test_snapshot_restore_continues_bit_identically(tmp_path, kind, fmt):
    extra = f"momentum: 0.9\nweight_decay: 0.01\nsnapshot_format: {fmt}\nlr_policy: \"multistep\"\n" \
            "gamma: 0.5\nstepvalue: 2\nstepvalue: 5\n"
    if kind == "AdaDelta":
        extra = extra.replace("momentum: 0.9", "momentum: 0.95")
    first = make_solver(tmp_path, kind, extra=extra)
    first.step(3)
    model, state = first.snapshot()
    suffix = ".h5" if fmt == "HDF5" else ""
    assert model == f"{tmp_path / 'snap'}_iter_3.caffemodel{suffix}" and os.path.isfile(model)
    assert state == f"{tmp_path / 'snap'}_iter_3.solverstate{suffix}" and os.path.isfile(state)
    first.step(4)
    resumed = make_solver(tmp_path, kind, extra=extra)
    resumed.restore(state)
    assert resumed.iter == 3 and resumed.current_step == first_step_at(3)
    resumed.step(4)
    for name in ("ip/0", "ip/1"):
        np.testing.assert_array_equal(resumed.workspace[name], first.workspace[name])
    assert resumed.iter == first.iter == 7


def first_step_at(iteration):
    """multistep position after the calls for iterations 0..iteration-1 with stepvalues 2, 5."""
    return sum(1 for v in (2, 5) if v <= iteration - 1)


def test_solverstate_layout(tmp_path):
    solver = make_solver(tmp_path, "Adam", extra="momentum: 0.9\n")
    solver.step(2)
    _, state = solver.snapshot()
    msg = read_solver_state(state)
    assert msg.iter == 2 and msg.learned_net.endswith("snap_iter_2.caffemodel")
    # Adam: m for every param, then v for every param (Caffe's history_ order)
    assert [tuple(h.shape.dim) for h in msg.history] == [(1, 3), (1,), (1, 3), (1,)]
    np.testing.assert_array_equal(np.asarray(msg.history[2].data).reshape(1, 3), solver.workspace["ip/0@history1"])


def test_restore_rejects_other_solver_type(tmp_path):
    sgd = make_solver(tmp_path, "SGD")
    sgd.step(1)
    _, state = sgd.snapshot()
    adam = make_solver(tmp_path, "Adam")
    with pytest.raises(CaffeError, match="2 history blobs; this Adam solver needs 4"):
        adam.restore(state)


def test_pycaffe_anchors(tmp_path, monkeypatch):
    solver = make_solver(tmp_path, "SGD", cls=S.SGDSolver,
                         extra='base_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\nlr_policy: "inv"\n'
                               "gamma: 0.0001\npower: 0.75\n")
    assert solver.iter == 0 and len([solver.net] + solver.test_nets) == 1
    for p in solver.net.learnable_params:
        solver.workspace[p.name][...] = 0
        solver.workspace[p.diff_name][...] = 1
    solver.apply_update()
    for p in solver.net.learnable_params:
        expected = -0.01 * p.lr_mult
        np.testing.assert_allclose(solver.workspace[p.name], expected, rtol=1e-6)
    monkeypatch.chdir(tmp_path)
    solver.param.snapshot_prefix = "model"
    solver.snapshot()
    assert os.path.isfile("model_iter_0.caffemodel") and os.path.isfile("model_iter_0.solverstate")


def test_solve_runs_to_max_iter_with_tests(tmp_path, capsys):
    import sys

    h5 = tmp_path / "data.h5"
    solver = make_solver(tmp_path, "SGD", extra="momentum: 0.9\ntest_iter: 2\ntest_interval: 5\ndisplay: 5\n"
                                                "snapshot: 0\naverage_loss: 3\n")
    assert h5.exists()
    solver.param.max_iter = 10
    solver.log_stream = sys.stdout
    solver.solve()
    assert solver.iter == 10
    out = capsys.readouterr().out
    assert "Iteration 5, Testing net (#0)" in out and "Test net output #0: loss = " in out
    assert "Train net output #0: loss =" in out and "Optimization Done." in out
    assert os.path.isfile(f"{tmp_path / 'snap'}_iter_10.caffemodel")   # snapshot_after_train
    assert [it for it, _, _ in solver.test_scores] == [0, 5, 10]
    # the test net shares the trained weights through the workspace
    assert solver.test_nets[0].workspace is solver.net.workspace


def test_legacy_solver_type_enum_dispatch(tmp_path):
    solver = make_solver(tmp_path, "SGD")
    text = (tmp_path / "solver_SGD.prototxt").read_text().replace('type: "SGD"', "solver_type: NESTEROV")
    (tmp_path / "legacy.prototxt").write_text(text)
    assert type(S.get_solver(str(tmp_path / "legacy.prototxt"), log=False)) is S.NesterovSolver
    del solver



def test_test_states_select_layers_per_test_net(tmp_path):
    solver = make_solver(tmp_path, "SGD")
    net_file = tmp_path / "net_4.prototxt"
    net_file.write_text(net_file.read_text() + 'layer { name: "twice" type: "Power" bottom: "ip" top: "twice" '
                        'power_param { scale: 2 } include { stage: "a" } }\n')
    text = (tmp_path / "solver_SGD.prototxt").read_text()
    text += 'test_iter: 1\ntest_iter: 2\ntest_interval: 10\ntest_state { stage: "a" }\ntest_state { stage: "b" }\n'
    (tmp_path / "staged.prototxt").write_text(text)
    solver = S.get_solver(str(tmp_path / "staged.prototxt"), log=False)
    assert [net.outputs for net in solver.test_nets] == [["loss", "twice"], ["loss"]]
    assert solver.net.outputs == ["loss"]
    scores = solver.test_all()
    assert set(scores[0]) == {"loss", "twice"} and set(scores[1]) == {"loss"}


def test_restore_continues_exactly_with_lmdb_crops_and_dropout(tmp_path):
    """Data positions, random crops/mirrors and dropout masks resume where the snapshot left them."""
    pytest.importorskip("lmdb")
    from cgvm.frontends.caffe.digits import write_lmdb

    images = np.random.default_rng(0).integers(0, 255, (10, 1, 8, 8), dtype=np.uint8)
    write_lmdb(str(tmp_path / "db"), images, np.arange(10) % 3)
    (tmp_path / "net.prototxt").write_text(
        f'layer {{ name: "d" type: "Data" top: "data" top: "label" transform_param {{ crop_size: 6 mirror: true '
        f'scale: 0.01 }} data_param {{ source: "{tmp_path / "db"}" batch_size: 4 backend: LMDB }} }}\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 8 '
        'weight_filler { type: "xavier" } } }\n'
        'layer { name: "drop" type: "Dropout" bottom: "ip" top: "ip" }\n'
        'layer { name: "out" type: "InnerProduct" bottom: "ip" top: "out" inner_product_param { num_output: 3 '
        'weight_filler { type: "xavier" } } }\n'
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "out" bottom: "label" top: "loss" }\n')
    (tmp_path / "solver.prototxt").write_text(
        f'net: "{tmp_path / "net.prototxt"}"\nbase_lr: 0.1\nmomentum: 0.9\nlr_policy: "fixed"\nmax_iter: 10\n'
        f'random_seed: 5\nsnapshot_prefix: "{tmp_path / "snap"}"\n')
    first = S.get_solver(str(tmp_path / "solver.prototxt"), log=False)
    first.step(3)
    _, state = first.snapshot()
    first.step(5)
    resumed = S.get_solver(str(tmp_path / "solver.prototxt"), log=False)
    resumed.restore(state)
    resumed.step(5)
    for p in first.net.learnable_params:
        np.testing.assert_array_equal(resumed.workspace[p.name], first.workspace[p.name])


def test_smoothed_loss_is_the_mean_of_the_last_average_loss_losses(tmp_path):
    raw, smoothed = [], []
    plain = make_solver(tmp_path, "SGD", extra="momentum: 0.9\n")
    plain.on_iteration = lambda it, loss: raw.append(loss)
    plain.step(6)
    averaged = make_solver(tmp_path, "SGD", extra="momentum: 0.9\naverage_loss: 3\n")
    averaged.on_iteration = lambda it, loss: smoothed.append(loss)
    averaged.step(6)
    expected = [np.mean(raw[max(0, i - 2):i + 1]) for i in range(6)]
    np.testing.assert_allclose(smoothed, expected, rtol=1e-6)
    assert raw[0] > raw[-1]
