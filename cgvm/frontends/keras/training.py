"""compile / fit / evaluate / predict / train_on_batch for Keras models.

One training step is one compiled cgvm Function: the forward pass in training mode, the losses
(weighted per output, plus regularization and ``add_loss`` terms), ``cgvm.grad`` of the total, and
the optimizer's updates, with weights, optimizer slots and BatchNorm statistics all updated in
the Workspace by the Function itself. Metrics come out of the same call as batch means and are
averaged over the epoch in Python, weighted by batch size, as Keras' running means are.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...autodiff import grad
from ...errors import GraphBuildError
from ...compiled import compile as cg_compile
from ...ir.graph import Value, current_source, input_value, source_scope
from ...ir.types import TensorType
from ...ops import elementwise as ew
from . import backend as K
from . import callbacks as callbacks_mod
from . import distribution as dist_mod
from . import losses as losses_mod
from . import metrics as metrics_mod
from . import optimizers as optimizers_mod


def _as_list(x: Any) -> List[Any]:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _per_output(spec: Any, names: Sequence[str], what: str, default: Any = None) -> List[Any]:
    """A per-output list from a single value, a list, or a dict keyed by output names."""
    if isinstance(spec, dict):
        unknown = set(spec) - set(names)
        if unknown:
            raise ValueError(f"{what} names unknown outputs {sorted(unknown)}; the outputs are {list(names)}")
        return [spec.get(n, default) for n in names]
    if isinstance(spec, (list, tuple)) and len(names) > 1:
        if len(spec) != len(names):
            raise ValueError(f"{what} has {len(spec)} entries for {len(names)} outputs")
        return list(spec)
    if isinstance(spec, (list, tuple)) and what == "metrics":
        return [list(spec)] * len(names)
    return [spec] * len(names)


class TrainingMixin:
    """The training API of Model (mixed in; the model supplies ``forward`` and ``input_types``)."""

    def __init__(self) -> None:
        self.optimizer: Optional[optimizers_mod.Optimizer] = None
        self.compiled = False
        self.stop_training = False
        self.history: Optional[callbacks_mod.History] = None
        self._functions: Dict[Any, Any] = {}
        self._step_rng = np.random.default_rng()

    # -- compile
    def compile(self, optimizer: Any = "rmsprop", loss: Any = None, loss_weights: Any = None, metrics: Any = None,
                weighted_metrics: Any = None, run_eagerly: bool = False, steps_per_execution: int = 1,
                jit_compile: Any = "auto", auto_scale_loss: bool = True) -> None:
        self.optimizer = optimizers_mod.get(optimizer)
        self.loss = loss
        self.loss_weights = loss_weights
        self._metric_spec = metrics
        self._count_metrics: Dict[str, Any] = {}
        self._summed_metrics: Dict[str, Any] = {}
        self.compiled = True
        self._functions = {}

    def _check_compiled(self) -> None:
        if not self.compiled or self.loss is None:
            raise GraphBuildError(f"model {self.name!r} must be compiled with a loss before training or "
                                  "evaluating: call model.compile(optimizer, loss)")

    # -- data handling
    def _inputs_list(self, x: Any) -> List[np.ndarray]:
        if isinstance(x, dict):
            names = getattr(self, "input_names", None) or list(x)
            return [np.asarray(x[n]) for n in names]
        return [np.asarray(a) for a in _as_list(x)]

    def _targets_list(self, y: Any) -> List[np.ndarray]:
        if isinstance(y, dict):
            return [np.asarray(y[n]) for n in self.output_names]
        return [np.asarray(a) for a in _as_list(y)]

    def _ensure_built(self, xs: Sequence[np.ndarray]) -> None:
        if hasattr(self, "ensure_built"):
            self.ensure_built(xs)

    @staticmethod
    def _feed(arrays: Sequence[np.ndarray], types: Sequence[TensorType]) -> List[np.ndarray]:
        out = []
        for a, t in zip(arrays, types):
            out.append(a if a.dtype == t.dtype.np else a.astype(t.dtype.np))
        return out

    # -- graphs
    def _build_losses(self, outs: List[Value], ys: List[Value], sws: List[Value],
                      masks: Optional[List[Optional[Value]]] = None):
        names = self.output_names
        loss_fns = [losses_mod.get(l) for l in _per_output(self.loss, names, "loss")]
        weights = _per_output(self.loss_weights, names, "loss_weights", 1.0) if self.loss_weights is not None \
            else [1.0] * len(names)
        per_output: List[Optional[Value]] = []
        terms: List[Value] = []
        masks = masks or [None] * len(outs)
        where = current_source()
        for name, out, y, sw, fn, w, mask in zip(names, outs, ys, sws, loss_fns, weights, masks):
            if fn is None:
                per_output.append(None)
                continue
            # the loss's nodes carry its name (TensorBoard's scope) and still the user's line
            label = "loss" if len(names) == 1 else f"{name}_loss"
            with source_scope(f"keras loss {label!r} (compiled at {where})"):
                if isinstance(fn, losses_mod.Loss):
                    value = fn(y, out, sw, mask=mask)
                else:
                    value = losses_mod.reduce_loss(fn(y, out), sw, mask=mask)
            per_output.append(value)
            terms.append(value if w in (None, 1.0) else ew.mul(value, float(w)))
        total = ew.add_n(terms)
        if total is None:
            raise GraphBuildError(f"model {self.name!r}: no output has a loss")
        return total, per_output, loss_fns

    def _build_metrics(self, outs, ys, sws, loss_fns, y_arrays, masks=None) -> Tuple[List[str], List[Value]]:
        names = self.output_names
        spec = _per_output(self._metric_spec, names, "metrics") if self._metric_spec is not None else \
            [[] for _ in names]
        labels, values = [], []
        masks = masks or [None] * len(outs)
        for k, (out, y, sw, mspec, lf) in enumerate(zip(outs, ys, sws, spec, loss_fns)):
            # Keras weights a metric's values by the prediction's mask (masked steps count zero)
            weight = sw if masks[k] is None else losses_mod.masked_weights(sw, masks[k], out.dtype)
            for m in _as_list(mspec):
                metric = metrics_mod.get(m, loss=lf, y_true_ndim=y_arrays[k].ndim, y_pred_shape=out.shape)
                label = metric.name if len(names) == 1 else f"{names[k]}_{metric.name}"
                labels.append(label)
                counts = getattr(metric, "accumulates_counts", False)   # Precision, Recall, AUC: summed counts
                # DataParallel: a mean metric gives its sums, added over the ranks before dividing
                summed = not counts and dist_mod.active_group() is not None
                with source_scope(f"keras metric {label!r} (compiled at {current_source()})"):
                    values.append(metric.batch_sums(y, out, weight) if summed else metric.batch_value(y, out, weight))
                if counts:
                    self._count_metrics[label] = metric
                if summed:
                    self._summed_metrics[label] = metric
        return labels, values

    def _regularization(self) -> Optional[Value]:
        return ew.add_n([K.to_value(w.regularizer(w.value)) for w in self.trainable_weights
                         if w.regularizer is not None])

    def _make_function(self, xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], train: bool):
        in_types = self.input_types(xs)
        x_vals = [input_value(t, f"x{i}") for i, t in enumerate(in_types)]
        y_vals = [input_value(TensorType((None,) + a.shape[1:], _target_dtype(a)), f"y{i}") for i, a in enumerate(ys)]
        sw_vals = [input_value(TensorType((None,), "float32"), f"sample_weight{i}") for i in range(len(ys))]
        seed = input_value(TensorType((), "int64"), "seed")
        # DataParallel: each rank's losses are weighted by its share of the global batch (rows * ranks /
        # global rows), so that the mean over the ranks is the global batch's loss; metrics are not
        share = input_value(TensorType((), "float32"), "loss_share") if dist_mod.active_group() is not None else None
        loss_sws = sw_vals if share is None else [ew.mul(sw, share) for sw in sw_vals]
        scope = K.BuildScope(training=train, seed=seed if train else None)
        with K.build_scope(scope):
            outs, masks = self.forward_with_masks(x_vals, training=train)
            if len(outs) != len(ys):
                raise ValueError(f"model {self.name!r} has {len(outs)} outputs but {len(ys)} targets were given")
            total, per_output, loss_fns = self._build_losses(outs, y_vals, loss_sws, masks)
            labels, metric_values = self._build_metrics(outs, y_vals, sw_vals, loss_fns, ys, masks)
        extra = [v for v in [self._regularization()] + list(scope.losses) if v is not None]
        for term in extra:
            total = ew.add(total, ew.cast(term, dtype=total.dtype) if term.dtype is not total.dtype else term)
        names = ["loss"]
        results = [total]
        if len(outs) > 1:
            for n, v in zip(self.output_names, per_output):
                if v is not None:
                    names.append(f"{n}_loss")
                    results.append(v)
        names += labels
        results += metric_values
        updates: Dict[Value, Value] = {}
        if train:
            trainable = self.trainable_weights
            grads = grad(total, [w.value for w in trainable], disconnected_inputs="ignore")
            grads = dist_mod.reduce_gradients(grads, [w.value.name for w in trainable])   # DataParallel
            updates.update(self.optimizer.updates(trainable, grads))
            for param, new in scope.updates.values():
                updates[param] = new
        for param, new in scope.state_updates.values():
            updates[param] = new
        inputs = x_vals + y_vals + sw_vals + ([share] if share is not None else []) + ([seed] if train else [])
        fn = cg_compile(inputs, results, updates=updates, workspace=K.get_workspace(),
                        name=f"{self.name}_{'train' if train else 'test'}_step")
        if train:   # DataParallel: every rank starts from rank 0's weights and optimizer state
            dist_mod.broadcast_weights(K.get_workspace(), [p.name for p in updates] +
                                       [w.value.name for w in self.weights])
        return fn, names, in_types, [v.type for v in y_vals], share is not None

    def _function(self, xs, ys, train: bool):
        key = (train, tuple((a.ndim, _target_dtype(a)) for a in ys), dist_mod.active_group() is not None)
        hit = self._functions.get(key)
        if hit is None:
            hit = self._functions[key] = self._make_function(xs, ys, train)
        return hit

    def _predict_function(self, xs):
        hit = self._functions.get("predict")
        if hit is None:
            in_types = self.input_types(xs)
            x_vals = [input_value(t, f"x{i}") for i, t in enumerate(in_types)]
            scope = K.BuildScope(training=False)
            with K.build_scope(scope):
                outs = self.forward(x_vals, training=False)
            fn = cg_compile(x_vals, outs, workspace=K.get_workspace(), name=f"{self.name}_predict",
                            updates={param: new for param, new in scope.state_updates.values()})
            hit = self._functions["predict"] = (fn, in_types)
        return hit

    # -- steps
    def _run_step(self, xs, ys, sws, train: bool, share: float = 1.0) -> Dict[str, Any]:
        """One compiled step; ``share``: this rank's weight in the global batch (DataParallel)."""
        fn, names, in_types, y_types, takes_share = self._function(xs, ys, train)
        args = self._feed(xs, in_types) + self._feed(ys, y_types) + [np.asarray(s, np.float32) for s in sws]
        if takes_share:
            args.append(np.asarray(share, np.float32))
        if train:
            self.optimizer.before_step()
            args.append(np.asarray(self._step_rng.integers(0, 2 ** 62), dtype=np.int64))
        results = fn(*args)
        # scalars (losses, mean metrics) as floats; the counts of counting metrics and, under
        # DataParallel, the sums of mean metrics as float64 vectors
        arrays = [K.as_array(r) for r in results]
        return {n: (float(a) if np.ndim(a) == 0 else np.asarray(a, np.float64)) for n, a in zip(names, arrays)}

    def _global_step(self, xs, ys, sws, rows: Any, train: bool) -> Dict[str, Any]:
        """One step on the global batch ``rows`` (indices or a slice): under DataParallel this rank's
        share of them, the logged values combined over the ranks (keras.distribution); else all of them."""
        if dist_mod.active_group() is None:
            return self._run_step([a[rows] for a in xs], [a[rows] for a in ys], [a[rows] for a in sws], train)
        mine, share = dist_mod.local_rows(np.arange(len(xs[0]))[rows])
        batch = self._run_step([a[mine] for a in xs], [a[mine] for a in ys], [a[mine] for a in sws], train, share)
        return dist_mod.global_logs(batch, getattr(self, "_summed_metrics", {}), getattr(self, "_count_metrics", {}))

    def _add_batch(self, sums: Dict[str, Any], batch: Dict[str, Any], count: int) -> None:
        """Running sums: sample-weighted means, and the counts of counting metrics."""
        counted = getattr(self, "_count_metrics", {})
        for k, v in batch.items():
            sums[k] = sums.get(k, 0.0) + (v if k in counted else v * count)

    def _logs(self, sums: Dict[str, Any], seen: int) -> Dict[str, Any]:
        counted = getattr(self, "_count_metrics", {})
        return {k: (counted[k].result_from(v) if k in counted else v / seen) for k, v in sums.items()}

    def _weights_for(self, ys, sample_weight, class_weight) -> List[np.ndarray]:
        n = len(ys[0]) if ys else 0
        sws = []
        for k, y in enumerate(ys):
            sw = np.ones(n, np.float32)
            if sample_weight is not None:
                given = sample_weight[k] if isinstance(sample_weight, (list, tuple)) else sample_weight
                sw = sw * np.asarray(given, np.float32).reshape(n)
            if class_weight is not None:
                labels = y.argmax(-1) if y.ndim > 1 and y.shape[-1] > 1 else y.reshape(n)
                sw = sw * np.array([class_weight.get(int(c), 1.0) for c in labels], np.float32)
            sws.append(sw)
        return sws

    def train_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None, class_weight: Any = None,
                       return_dict: bool = False) -> Any:
        self._check_compiled()
        xs, ys = self._inputs_list(x), self._targets_list(y)
        self._ensure_built(xs)
        logs = self._logs(self._global_step(xs, ys, self._weights_for(ys, sample_weight, class_weight), slice(None),
                                            True), 1)
        return logs if return_dict else _flat_result(logs)

    def test_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None, return_dict: bool = False) -> Any:
        self._check_compiled()
        xs, ys = self._inputs_list(x), self._targets_list(y)
        self._ensure_built(xs)
        logs = self._logs(self._global_step(xs, ys, self._weights_for(ys, sample_weight, None), slice(None), False), 1)
        return logs if return_dict else _flat_result(logs)

    def predict_on_batch(self, x: Any) -> Any:
        return self.predict(x, batch_size=len(self._inputs_list(x)[0]), verbose=0)

    # -- loops
    def fit(self, x: Any = None, y: Any = None, batch_size: Optional[int] = None, epochs: int = 1,
            verbose: Any = "auto", callbacks: Any = None, validation_split: float = 0.0,
            validation_data: Any = None, shuffle: bool = True, class_weight: Any = None, sample_weight: Any = None,
            initial_epoch: int = 0, steps_per_epoch: Optional[int] = None, validation_steps: Any = None,
            validation_batch_size: Optional[int] = None, validation_freq: int = 1) -> callbacks_mod.History:
        self._check_compiled()
        xs, ys = self._inputs_list(x), self._targets_list(y)
        self._ensure_built(xs)
        n = len(xs[0])
        sws = self._weights_for(ys, sample_weight, class_weight)
        if validation_data is None and validation_split:
            cut = int(n * (1.0 - validation_split))
            validation_data = ([a[cut:] for a in xs], [a[cut:] for a in ys])
            xs, ys, sws = [a[:cut] for a in xs], [a[:cut] for a in ys], [a[:cut] for a in sws]
            n = cut
        batch_size = batch_size or 32
        steps = max(1, -(-n // batch_size))
        verbose = 1 if verbose == "auto" else int(verbose)
        history = callbacks_mod.History()
        if not dist_mod.is_root():   # DataParallel: callbacks and the progress bar run on rank 0
            verbose, callbacks = 0, None
        cbs = [history] + ([callbacks_mod.ProgbarLogger(verbose)] if verbose else []) + _as_list(callbacks)
        cb = callbacks_mod.CallbackList(cbs, self, {"epochs": epochs, "steps": steps, "verbose": verbose})
        self.stop_training = False
        cb.on_train_begin()
        for epoch in range(initial_epoch, epochs):
            cb.on_epoch_begin(epoch)
            order = dist_mod.same_order(np.random.permutation(n) if shuffle else np.arange(n))
            sums: Dict[str, float] = {}
            seen = 0
            logs: Dict[str, float] = {}
            for step in range(steps):
                idx = order[step * batch_size:(step + 1) * batch_size]
                cb.on_train_batch_begin(step)
                batch = self._global_step(xs, ys, sws, idx, True)   # DataParallel: this rank's share
                seen += len(idx)
                self._add_batch(sums, batch, len(idx))
                logs = self._logs(sums, seen)
                cb.on_train_batch_end(step, dict(logs))
                self.stop_training = dist_mod.root_decides(self.stop_training)
                if self.stop_training:
                    break
            epoch_logs = dict(logs)
            if validation_data is not None and (epoch + 1) % validation_freq == 0:
                vx, vy = validation_data[0], validation_data[1]
                vsw = validation_data[2] if len(validation_data) > 2 else None
                val = self.evaluate(vx, vy, batch_size=validation_batch_size or batch_size, verbose=0,
                                    sample_weight=vsw, return_dict=True, callbacks=cb)
                epoch_logs.update({f"val_{k}": v for k, v in val.items()})
            cb.on_epoch_end(epoch, epoch_logs)
            if self.stop_training:
                break
        cb.on_train_end()
        self.history = history
        return history

    def evaluate(self, x: Any = None, y: Any = None, batch_size: Optional[int] = None, verbose: Any = "auto",
                 sample_weight: Any = None, steps: Any = None, callbacks: Any = None, return_dict: bool = False,
                 **kwargs: Any) -> Any:
        self._check_compiled()
        xs, ys = self._inputs_list(x), self._targets_list(y)
        self._ensure_built(xs)
        n = len(xs[0])
        sws = self._weights_for(ys, sample_weight, None)
        batch_size = batch_size or 32
        nsteps = max(1, -(-n // batch_size))
        verbose = 1 if verbose == "auto" and dist_mod.is_root() else (int(verbose) if dist_mod.is_root() else 0)
        bar = callbacks_mod.Progbar(nsteps, verbose=verbose) if verbose else None
        # fit passes its CallbackList (the callbacks see validation as Keras' do); a list is wrapped
        cb = callbacks if isinstance(callbacks, callbacks_mod.CallbackList) else callbacks_mod.CallbackList(
            _as_list(callbacks), self, {"steps": nsteps, "verbose": verbose})
        cb.on_test_begin()
        sums: Dict[str, float] = {}
        for step in range(nsteps):
            sl = slice(step * batch_size, (step + 1) * batch_size)
            cb.on_test_batch_begin(step)
            batch = self._global_step(xs, ys, sws, sl, False)   # DataParallel: this rank's share
            count = len(xs[0][step * batch_size:(step + 1) * batch_size])
            self._add_batch(sums, batch, count)
            cb.on_test_batch_end(step, self._logs(sums, min(n, (step + 1) * batch_size)))
            if bar:
                bar.update(step + 1, self._logs(sums, min(n, (step + 1) * batch_size)), finalize=step + 1 == nsteps)
        logs = self._logs(sums, n)
        cb.on_test_end(dict(logs))
        return logs if return_dict else _flat_result(logs)

    def predict(self, x: Any, batch_size: Optional[int] = None, verbose: Any = "auto", steps: Any = None,
                callbacks: Any = None) -> Any:
        xs = self._inputs_list(x)
        self._ensure_built(xs)
        fn, in_types = self._predict_function(xs)
        n = len(xs[0])
        batch_size = batch_size or 32
        chunks: List[List[np.ndarray]] = []
        if dist_mod.active_group() is not None:   # DataParallel: this rank's rows, gathered below
            mine = dist_mod.local_rows(np.arange(n))[0]
            xs, n = [a[mine] for a in xs], len(mine)
        for start in range(0, n, batch_size):
            outs = fn(*self._feed([a[start:start + batch_size] for a in xs], in_types))
            chunks.append([K.as_array(o) for o in outs])
        results = dist_mod.gather_rows([np.concatenate([c[k] for c in chunks]) for k in range(len(chunks[0]))])
        if len(results) == 1:
            return results[0]
        struct = getattr(self, "_output_struct", None)
        if isinstance(struct, dict):
            return dict(zip(struct, results))
        return results


def _target_dtype(a: np.ndarray) -> str:
    if a.dtype.kind in "iu":
        return "int64"
    if a.dtype.kind == "b":
        return "float32"
    return "float32" if a.dtype == np.float64 else a.dtype.name


def _flat_result(logs: Dict[str, float]) -> Any:
    """Keras' list form: loss first, then the rest in compile order (a bare float with no metrics)."""
    values = list(logs.values())
    return values[0] if len(values) == 1 else values
