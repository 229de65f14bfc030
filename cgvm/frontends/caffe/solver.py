"""Caffe solvers: ``SGDSolver`` and friends, ``get_solver``, as pycaffe exposes them.

A solver reads a solver prototxt, builds the train net and the test nets over one Workspace
(same-named learnable blobs are then one array: test nets see the trained weights without
copies), and compiles ONE Function per training step: forward, backward and Caffe's update
(solver_updates.py) with the history blobs in the Workspace. The host only fetches the next
batch and evaluates the learning-rate policy. Around that sits Caffe's Solver::Step: periodic
tests, display with a smoothed loss, snapshots (BINARYPROTO or HDF5, with .solverstate), and
restore, which continues exactly as if training had not stopped (the .solverstate is Caffe's;
a small JSON file beside it adds the random generators and data positions Caffe does not keep).
"""
from __future__ import annotations

import math
import os
import sys
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from cgvm.env import check_bytes, shape_bytes

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe import solver_parallel
from cgvm.frontends.caffe import solver_state
from cgvm.frontends.caffe import solver_updates as su
from cgvm.frontends.caffe import weights as _weights
from cgvm.frontends.caffe.errors import CaffeError
from cgvm.frontends.caffe.prototxt import read_solver
from cgvm.backend import host_array
from cgvm.compiled_function import Function
from cgvm.ir import TensorType, input_value, param_value
from cgvm.ops import elementwise as ew
from cgvm.ops import shape as shp
from cgvm.vm.workspace import Workspace

__all__ = ["Solver", "SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver", "AdaDeltaSolver",
           "AdamSolver", "get_solver", "SOLVERS"]

class Solver:
    """Caffe's Solver over cgvm nets. ``Solver(solver_file)`` or ``Solver(param=SolverParameter)``.

    Keywords beyond pycaffe's: ``backend`` ("numpy" or "cupy"), ``log`` (a text stream for
    Caffe's log lines; default stderr, like glog; False: none), ``weights`` (replaces the file's
    ``weights:``), ``allow_python_layers``, ``level``/``stages`` (added to the train state, as
    ``caffe train --level --stage`` does).
    """

    type_name = "SGD"

    def __init__(self, solver_file: Optional[str] = None, *, param: Optional[caffe_pb2.SolverParameter] = None,
                 backend: Any = None, log: Any = None, weights: Optional[List[str]] = None,
                 allow_python_layers: Optional[bool] = None, level: int = 0, stages: Tuple[str, ...] = ()):
        if param is None:
            if solver_file is None:
                raise TypeError("a solver needs a solver file (or param=SolverParameter)")
            if not os.path.isfile(solver_file):
                raise FileNotFoundError(f"Could not open file {solver_file}")
            param = read_solver(solver_file)
        self.param = param
        self.solver_file = solver_file
        self.log_stream = sys.stderr if log is None else (None if log is False else log)
        self._solver_count = solver_parallel.data_shard.solver_count()
        if self._solver_count > 1:
            solver_parallel.group()                    # fails early, with the fix, outside an MPI run
            if not solver_parallel.is_root():
                self.log_stream = None                 # rank 0 alone logs, tests and snapshots (Caffe's root)
        su.check_solver_param(param, self.type_name)
        self.iter = 0
        self.current_step = 0
        self._losses: List[float] = []
        self._smoothed = 0.0
        self._callbacks: List[Tuple[Callable[[], None], Callable[[], None]]] = []
        self.on_iteration: Optional[Callable[[int, float], None]] = None   # progress hook (the CLI's bar)
        self.listeners: List[Any] = []   # told of displays and tests (log_to_tensorboard)
        self.test_scores: List[Tuple[int, int, "OrderedDict[str, float]"]] = []  # (iter, test net, means)
        self._net_options = dict(allow_python_layers=allow_python_layers)
        seed = solver_parallel.shared_seed(int(param.random_seed) if param.random_seed >= 0 else None)
        self.workspace = Workspace(_default_backend() if backend is None else backend)
        self.net = self._make_net(*self._train_source(), caffe_pb2.TRAIN, param.train_state, seed, level, stages)
        self.test_nets = [self._make_net(src, name, caffe_pb2.TEST, state, None if seed is None else seed + 1 + i,
                                         0, ())
                          for i, (src, name, state) in enumerate(self._test_sources())]
        if len(param.test_iter) != len(self.test_nets):
            raise CaffeError(f"the solver has {len(self.test_nets)} test net(s) but {len(param.test_iter)} "
                             "test_iter value(s); give one per test net")
        if any(t < 0 for t in param.test_iter):
            raise CaffeError(f"test_iter must be >= 0 (batches per test), got {list(param.test_iter)}")
        if self.test_nets and param.test_interval <= 0:
            raise CaffeError("the solver has test nets but test_interval is not > 0; set how often to test")
        for path in (weights if weights is not None else _split_weights(param.weights)):
            self._log(f"Finetuning from {path}")
            for net in [self.net] + self.test_nets:
                net.copy_from(self._resolve(path))
        self._histories = su.history_names(self.type_name, [p.name for p in self.net.learnable_params])
        history_bytes = sum(shape_bytes(p.shape, self.net.dtype.itemsize) * len(self._histories[p.name])
                            for p in self.net.learnable_params)
        check_bytes(history_bytes + sum(getattr(n, "bytes_needed", 0) for n in [self.net] + self.test_nets),
                    f"{solver_file or '<solver>'}: the {self.type_name} solver (its nets and history blobs)",
                    parts=[("history blobs", history_bytes)] +
                          [(f"net {n.filename}", getattr(n, "bytes_needed", 0)) for n in [self.net] + self.test_nets])
        for p in self.net.learnable_params:
            for entry in self._histories[p.name]:
                self.workspace.set(entry, np.zeros(p.shape, self.net.dtype))
        self._step_fn: Optional[Function] = None
        self._accumulate_fn: Optional[Function] = None
        self._apply_fn: Optional[Function] = None
        if param.snapshot > 0:
            directory = os.path.dirname(param.snapshot_prefix) or "."
            if not os.access(directory, os.W_OK):
                raise CaffeError(f"cannot write snapshots to {param.snapshot_prefix!r}: directory {directory!r} "
                                 "is missing or not writable")

    # ------------------------------------------------------------------ nets
    def _resolve(self, path: str) -> str:
        """A path as Caffe reads it (from the working directory), else beside the solver file."""
        if os.path.exists(path) or self.solver_file is None or os.path.isabs(path):
            return path
        beside = os.path.join(os.path.dirname(self.solver_file), path)
        if os.path.exists(beside):
            return beside
        beside = os.path.join(os.path.dirname(self.solver_file), os.path.basename(path))
        return beside if os.path.exists(beside) else path

    def _train_source(self) -> Tuple[Any, Optional[str]]:
        p = self.param
        given = [f for f in ("net", "net_param", "train_net", "train_net_param") if p.HasField(f)]
        if len(given) != 1:
            raise CaffeError("the solver must give exactly one of net, net_param, train_net, train_net_param; "
                             f"it gives {', '.join(given) or 'none'}")
        field = given[0]
        if field.endswith("_param"):
            return getattr(p, field), f"{self.solver_file or '<solver>'}:{field}"
        return self._resolve(getattr(p, field)), None

    def _test_sources(self) -> List[Tuple[Any, Optional[str], Optional[caffe_pb2.NetState]]]:
        p = self.param
        sources: List[Tuple[Any, Optional[str]]] = [(n, f"{self.solver_file or '<solver>'}:test_net_param")
                                                    for n in p.test_net_param]
        sources += [(self._resolve(n), None) for n in p.test_net]
        if _has_generic_net(p):
            generic = (p.net_param, f"{self.solver_file or '<solver>'}:net_param") if p.HasField("net_param") \
                else (self._resolve(p.net), None)
            sources += [generic] * max(0, len(p.test_iter) - len(sources))
        if p.test_state and len(p.test_state) != len(sources):
            raise CaffeError(f"test_state is given {len(p.test_state)} times for {len(sources)} test nets")
        return [(src, name, p.test_state[i] if p.test_state else None) for i, (src, name) in enumerate(sources)]

    def _make_net(self, source: Any, filename: Optional[str], phase: int, state: Optional[caffe_pb2.NetState],
                  seed: Optional[int], level: int, stages: Tuple[str, ...]):
        from cgvm.frontends.caffe.pycaffe import Net

        level = level or (state.level if state is not None else 0)   # an explicit level wins
        all_stages = list(stages) + (list(state.stage) if state is not None else [])
        options = dict(self._net_options)
        if seed is not None:   # else the Net takes caffe.set_random_seed's seed, if any
            options["seed"] = seed
        return Net(source, phase=phase, level=level, stages=all_stages, workspace=self.workspace,
                   filename=filename, **options)

    # ------------------------------------------------------------------ compiled steps
    def _dtype(self):
        return self.net.dtype

    def _learnable(self, tg=None):
        """(ParamInfo, weight Value, gradient Value or None, history Values) per updated blob."""
        out = []
        params = tg.params if tg is not None else [p for p in self.net.learnable_params if p.lr_mult != 0.0]
        for p in params:
            t = TensorType(p.shape, self._dtype())
            weight = tg.param_values[p.name] if tg is not None else param_value(p.name, t)
            hist = [param_value(e, t) for e in self._histories[p.name]]
            out.append((p, weight, tg.grads.get(p.name) if tg is not None else None, hist))
        return out

    def _rate_inputs(self):
        rate = input_value(TensorType((), self._dtype()), "lr")
        corr = input_value(TensorType((), self._dtype()), "adam_correction") if self.type_name == "Adam" else None
        return rate, corr

    def _update_function(self, entries, rate, corr, outputs, extra_updates, name: str) -> Function:
        blobs = [su.LearnableBlob(w, g, h, p.lr_mult, p.decay_mult) for p, w, g, h in entries]
        new_w, steps, hists = su.build_updates(self.type_name, self.param, blobs, rate, corr)
        updates = dict(extra_updates)
        for (p, w, _, h), nw, step, nh in zip(entries, new_w, steps, hists):
            updates[w] = nw
            updates[param_value(p.diff_name, w.type)] = step   # Caffe leaves the step in the diff
            for old, new in zip(h, nh):
                updates[old] = new
        inputs = [rate] + ([corr] if corr is not None else [])
        return Function(inputs, outputs, updates=updates, workspace=self.workspace, name=name, update_held_arrays=True)

    def _compile(self) -> None:
        tg = self.net.training_graph()
        rate, corr = self._rate_inputs()
        entries = []
        accumulate: Dict[Any, Any] = {}
        resets = {}
        for p, w, g, h in self._learnable(tg):
            if g is None:   # disconnected from the loss: decay and momentum still apply, as in Caffe
                g = shp.zeros_like(w)
            if self.param.iter_size > 1:
                acc_entry = p.name + "@accumulated"
                self.workspace.set(acc_entry, np.zeros(p.shape, self._dtype()))
                acc = param_value(acc_entry, w.type)
                accumulate[acc] = ew.add(acc, g)
                resets[acc] = shp.zeros_like(acc)
                g = ew.add(acc, g)
            entries.append((p, w, g, h))
        entries = solver_parallel.reduce_entries(self, entries)   # several solvers: the mean gradient
        solver_parallel.broadcast_state(self)                     # ... from rank 0's weights
        self._output_names = list(tg.outputs)
        outputs = [tg.loss] + list(tg.outputs.values())
        self._step_fn = self._update_function(entries, rate, corr, outputs, {**tg.state_updates, **resets},
                                              f"{self.net.name or 'net'}_train_step")
        if accumulate:
            self._accumulate_fn = Function([], outputs, updates={**tg.state_updates, **accumulate},
                                           workspace=self.workspace, name=f"{self.net.name or 'net'}_accumulate",
                                           update_held_arrays=True)

    def _rate_args(self) -> List[np.ndarray]:
        try:
            rate, current_step = su.learning_rate(self.param, self.iter, self.current_step)
            if not math.isfinite(rate):
                raise ValueError(f"the rate is {rate}")
            args = [np.asarray(rate, self._dtype())]
            if self.type_name == "Adam":
                args.append(np.asarray(su.adam_correction(self.param, self.iter), self._dtype()))
        except (ZeroDivisionError, OverflowError, ValueError) as exc:   # e.g. gamma ** iter past a float
            raise CaffeError(f"{self.solver_file or '<solver>'}: lr_policy {self.param.lr_policy!r} at iteration "
                             f"{self.iter} gives no learning rate ({type(exc).__name__}: {exc}); check base_lr, "
                             "gamma, power, stepsize and the momentum values") from exc
        self._rate, self.current_step = rate, current_step
        return args

    def _store_outputs(self, results) -> None:
        """Train-net outputs into their blobs, so ``solver.net.blobs['loss'].data`` reads as in Caffe."""
        net = self.net
        for name, value in zip(self._output_names, results[1:]):
            net.write_blob(net._entry(name), value)

    # ------------------------------------------------------------------ Caffe's Step / Solve
    def step(self, iters: int) -> None:
        """Run ``iters`` iterations: tests, forward/backward/update, display and snapshots as configured."""
        if self._step_fn is None:
            self._compile()
        for listener in self.listeners:
            listener.on_compiled(self._step_fn)
        p = self.param
        stop = self.iter + int(iters)
        self._losses, self._smoothed, self._loss_start = [], 0.0, self.iter   # Caffe restarts the average
        tick, tick_iter = time.perf_counter(), self.iter
        while self.iter < stop:
            if (p.test_interval and self.iter % p.test_interval == 0 and (self.iter > 0 or p.test_initialization)
                    and solver_parallel.is_root()):
                self.test_all()
            for on_start, _ in self._callbacks:
                on_start()
            display = p.display and self.iter % p.display == 0
            loss = 0.0
            for _ in range(p.iter_size - 1):
                self.net.prepare_step()
                loss += float(self._accumulate_fn()[0])
            args = self._rate_args()
            self.net.prepare_step()
            results = self._step_fn(*args)
            loss = (loss + float(results[0])) / p.iter_size
            self._store_outputs(results)
            self._update_smoothed_loss(loss)
            if display:
                now = time.perf_counter()
                done = self.iter - tick_iter
                rate = done / (now - tick) if done and now > tick else 0.0
                self._log(f"Iteration {self.iter} ({rate:.4g} iter/s, {now - tick:.4g}s/{p.display} iters), "
                          f"loss = {self._smoothed:.6g}")
                tick, tick_iter = now, self.iter
                shown = self._log_outputs("Train", self.net, [host_array(r) for r in results[1:]],
                                          self._output_names)
                self._log(f"Iteration {self.iter}, lr = {self._rate:.6g}")
                for listener in self.listeners:
                    listener.on_display(self.iter, self._smoothed, self._rate, shown)
            for _, on_gradients_ready in self._callbacks:
                on_gradients_ready()
            self.iter += 1
            if self.on_iteration is not None:
                self.on_iteration(self.iter, self._smoothed)
            if p.snapshot and self.iter % p.snapshot == 0:
                self.snapshot()
        for listener in self.listeners:
            listener.flush()

    def solve(self, resume_file: Optional[str] = None) -> None:
        """Restore (if given), train to max_iter, then Caffe's final snapshot, display and test."""
        p = self.param
        self._log(f"Solving {self.net.name}")
        self._log(f"Learning Rate Policy: {p.lr_policy}")
        if resume_file:
            self._log(f"Restoring previous solver status from {resume_file}")
            self.restore(resume_file)
        self.step(p.max_iter - self.iter)
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0):
            self.snapshot()
        if p.display and self.iter % p.display == 0:
            loss = self.net._forward(0, len(self.net.layer_infos) - 1)
            self._update_smoothed_loss(loss)
            self._log(f"Iteration {self.iter}, loss = {self._smoothed:.6g}")
        if p.test_interval and self.iter % p.test_interval == 0 and solver_parallel.is_root():
            self.test_all()
        self._log("Optimization Done.")

    def _update_smoothed_loss(self, loss: float) -> None:
        """Caffe's running mean of the last ``average_loss`` losses."""
        window = self.param.average_loss
        if len(self._losses) < window:
            self._losses.append(loss)
            self._smoothed = (self._smoothed * (len(self._losses) - 1) + loss) / len(self._losses)
        else:
            index = (self.iter - getattr(self, "_loss_start", 0)) % window
            self._smoothed += (loss - self._losses[index]) / window
            self._losses[index] = loss

    @property
    def smoothed_loss(self) -> float:
        return self._smoothed

    # ------------------------------------------------------------------ testing
    def test_all(self) -> List["OrderedDict[str, float]"]:
        """Run every test net for its test_iter batches; log and return the mean of each output."""
        return [self.test(i) for i in range(len(self.test_nets))]

    def test(self, index: int = 0) -> "OrderedDict[str, float]":
        """Test net ``index``: outputs averaged over test_iter batches (element by element, as Caffe)."""
        self._log(f"Iteration {self.iter}, Testing net (#{index})")
        net = self.test_nets[index]
        ws, last = self.workspace, len(net.layer_infos) - 1
        names = net.outputs
        sums: Dict[str, np.ndarray] = {}
        loss = 0.0
        batches = int(self.param.test_iter[index])
        for _ in range(batches):
            loss += net._forward(0, last)
            for name in names:
                value = host_array(ws[net._entry(name)]).astype(np.float64)
                sums[name] = sums[name] + value if name in sums else value.copy()
        if self.param.test_compute_loss:
            self._log(f"Test loss: {loss / max(batches, 1):.6g}")
        means = [sums[n] / max(batches, 1) for n in names] if batches else []
        result = self._log_outputs("Test", net, means, names)
        self.test_scores.append((self.iter, index, result))
        for listener in self.listeners:
            listener.on_test(self.iter, index, result)
        return result

    def _log_outputs(self, kind: str, net, values, names) -> "OrderedDict[str, float]":
        """Caffe's "<kind> net output #k: name = v (* w = w*v loss)" lines, one per element."""
        result: "OrderedDict[str, float]" = OrderedDict()
        k = 0
        for name, value in zip(names, values):
            weight = net.blob_loss_weights.get(name, 0.0)
            flat = np.asarray(value, np.float64).ravel()
            for v in flat:
                extra = f" (* {weight:g} = {weight * v:.6g} loss)" if weight else ""
                self._log(f"    {kind} net output #{k}: {name} = {v:.6g}{extra}")
                k += 1
            result[name] = float(flat[0]) if flat.size == 1 else flat
        return result

    # ------------------------------------------------------------------ pycaffe extras
    def apply_update(self) -> None:
        """One update from the diffs now in the train net (lr policy, clip, normalize, decay, rule)."""
        if self._apply_fn is None:
            rate, corr = self._rate_inputs()
            entries = [(p, w, param_value(p.diff_name, w.type), h) for p, w, _, h in self._learnable()]
            self._apply_fn = self._update_function(entries, rate, corr, [], {}, "apply_update")
        self._apply_fn(*self._rate_args())

    @property
    def lr(self) -> float:
        """The current learning rate (advances multistep's position, as Caffe's GetLearningRate does)."""
        rate, self.current_step = su.learning_rate(self.param, self.iter, self.current_step)
        return rate

    def share_weights(self, net) -> None:
        """Make ``net`` use the train net's weights (by layer name)."""
        _weights.share_with(net, self.net)

    def add_callback(self, on_start: Any, on_gradients_ready: Optional[Callable[[], None]] = None) -> None:
        """Call ``on_start`` before and ``on_gradients_ready`` after each compiled step (or give one
        object with both methods, such as ``caffe.NCCL``, as pycaffe allows)."""
        if on_gradients_ready is None:
            on_start, on_gradients_ready = on_start.on_start, on_start.on_gradients_ready
        self._callbacks.append((on_start, on_gradients_ready))

    def log_to_tensorboard(self, log_dir: str) -> Any:
        """Log training to TensorBoard from now on: each display's train outputs, smoothed loss and
        learning rate (run ``log_dir/train``), each test pass's outputs (``log_dir/test``) and the
        compiled step's graph; see cgvm.frontends.caffe.board. Returns the SolverBoard (close it
        when done; events are flushed after every ``step``)."""
        from cgvm.frontends.caffe.board import SolverBoard

        board = SolverBoard(self, log_dir)
        self.listeners.append(board)
        return board

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> Tuple[str, str]:
        """Write ``<prefix>_iter_<N>.caffemodel`` and ``.solverstate`` (``.h5`` both for HDF5); with
        several solvers only rank 0 writes (the others return the paths it writes)."""
        if not solver_parallel.is_root():
            return solver_state.snapshot_paths(self)
        return solver_state.write_snapshot(self)

    def restore(self, state_file: str) -> None:
        """Load a .solverstate (or .solverstate.h5): iteration, lr position, weights and histories."""
        solver_state.restore(self, state_file)

    def _log(self, message: str) -> None:
        if self.log_stream is not None:
            print(message, file=self.log_stream, flush=True)


class SGDSolver(Solver):
    """Stochastic gradient descent with momentum: v = momentum*v + lr*g; w -= v."""
    type_name = "SGD"


class NesterovSolver(Solver):
    """Nesterov's accelerated gradient: w -= (1+momentum)*v - momentum*v_prev."""
    type_name = "Nesterov"


class AdaGradSolver(Solver):
    """AdaGrad: h += g^2; w -= lr*g / (sqrt(h) + delta)."""
    type_name = "AdaGrad"


class RMSPropSolver(Solver):
    """RMSProp: h = rms_decay*h + (1-rms_decay)*g^2; w -= lr*g / (sqrt(h) + delta)."""
    type_name = "RMSProp"


class AdaDeltaSolver(Solver):
    """AdaDelta with Caffe's placement of delta and of the learning rate."""
    type_name = "AdaDelta"


class AdamSolver(Solver):
    """Adam with the bias correction folded into the step size, as Caffe does."""
    type_name = "Adam"


SOLVERS = {cls.type_name: cls for cls in (SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver,
                                          AdaDeltaSolver, AdamSolver)}


def get_solver(solver_file: str, **kwargs: Any) -> Solver:
    """The solver class the file's ``type`` names (after upgrading a legacy ``solver_type``)."""
    if not os.path.isfile(solver_file):
        raise FileNotFoundError(f"Could not open file {solver_file}")
    param = read_solver(solver_file)
    cls = SOLVERS.get(param.type)
    if cls is None:
        raise CaffeError(f"{solver_file}: unknown solver type {param.type!r}; Caffe knows {', '.join(SOLVERS)}")
    return cls(solver_file, param=param, **kwargs)


def _has_generic_net(param: caffe_pb2.SolverParameter) -> bool:
    return param.HasField("net") or param.HasField("net_param")


def _split_weights(entries) -> List[str]:
    return [w for entry in entries for w in entry.split(",") if w]


def _default_backend() -> str:
    from cgvm.frontends.caffe.pycaffe import _mode

    return _mode["backend"]
