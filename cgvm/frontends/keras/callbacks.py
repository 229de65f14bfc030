"""Callbacks (History, EarlyStopping, ModelCheckpoint, ReduceLROnPlateau, CSVLogger, LearningRateScheduler,
LambdaCallback, TerminateOnNaN, TensorBoard) and the Keras 3 progress bar."""
from __future__ import annotations

import csv
import math
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np


class Callback:
    def __init__(self):
        self.model = None
        self.params: Dict[str, Any] = {}

    def set_model(self, model: Any) -> None:
        self.model = model

    def set_params(self, params: Dict[str, Any]) -> None:
        self.params = params

    def on_train_begin(self, logs=None): pass
    def on_train_end(self, logs=None): pass
    def on_epoch_begin(self, epoch, logs=None): pass
    def on_epoch_end(self, epoch, logs=None): pass
    def on_train_batch_begin(self, batch, logs=None): pass
    def on_train_batch_end(self, batch, logs=None): pass
    def on_test_begin(self, logs=None): pass
    def on_test_end(self, logs=None): pass
    def on_test_batch_begin(self, batch, logs=None): pass
    def on_test_batch_end(self, batch, logs=None): pass
    def on_predict_begin(self, logs=None): pass
    def on_predict_end(self, logs=None): pass
    def on_predict_batch_begin(self, batch, logs=None): pass
    def on_predict_batch_end(self, batch, logs=None): pass


class CallbackList:
    def __init__(self, callbacks: List[Callback], model: Any, params: Dict[str, Any]):
        self.callbacks = callbacks
        for cb in callbacks:
            cb.set_model(model)
            cb.set_params(params)

    def __getattr__(self, hook: str):
        def call(*args: Any) -> None:
            for cb in self.callbacks:
                getattr(cb, hook)(*args)
        return call


class History(Callback):
    def on_train_begin(self, logs=None):
        self.epoch: List[int] = []
        self.history: Dict[str, List[float]] = {}

    def on_epoch_end(self, epoch, logs=None):
        self.epoch.append(epoch)
        for k in sorted(logs or {}):
            self.history.setdefault(k, []).append(logs[k])
        self.model.history = self


class Progbar:
    """Keras 3's progress bar: ``5/5 ━━━━━━━━━━━━━━━━━━━━ 2s 360ms/step - accuracy: 0.1500 - loss: 2.3019``."""

    def __init__(self, target: Optional[int], width: int = 20, verbose: int = 1, stream: Any = None):
        self.target, self.width, self.verbose = target, width, verbose
        self.stream = stream or sys.stdout
        self.dynamic = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._start = time.time()
        self._prev_width = 0
        self._last = 0.0

    @staticmethod
    def _fmt_time(per_step: float) -> str:
        if per_step >= 1 or per_step == 0:
            return f" {per_step:.0f}s/step"
        if per_step >= 1e-3:
            return f" {per_step * 1e3:.0f}ms/step"
        return f" {per_step * 1e6:.0f}us/step"

    @staticmethod
    def _fmt_logs(values: Dict[str, float]) -> str:
        out = ""
        for k in sorted(values):
            v = float(values[k])
            out += f" - {k}: {v:.4f}" if abs(v) > 1e-3 else f" - {k}: {v:.4e}"
        return out

    def update(self, current: int, values: Dict[str, float], finalize: bool = False) -> None:
        now = time.time()
        per_step = (now - self._start) / max(current, 1)
        if self.verbose == 2:
            if finalize:
                digits = int(math.log10(self.target)) + 1 if self.target else 1
                self.stream.write(f"{current:{digits}d}/{self.target} - {now - self._start:.0f}s -"
                                  f"{self._fmt_time(per_step)}{self._fmt_logs(values)}\n")
                self.stream.flush()
            return
        if self.verbose != 1 or (not finalize and now - self._last < 0.05):
            return
        self._last = now
        digits = int(math.log10(self.target)) + 1 if self.target else 1
        done = int(self.width * current / self.target) if self.target else 0
        count = f"{current:{digits}d}/{self.target}"
        if self.dynamic:
            bar = f"\x1b[1m{count}\x1b[0m \x1b[32m{'━' * done}\x1b[0m\x1b[37m{'━' * (self.width - done)}\x1b[0m"
        else:
            bar = f"{count} {'━' * self.width}"
        eta = per_step * (self.target - current) if self.target else 0
        info = f" {now - self._start:.0f}s" if finalize else f" {eta:.0f}s"
        info += self._fmt_time(per_step) + self._fmt_logs(values)
        plain = len(count) + 1 + self.width + len(info)
        line = ("\r" if self.dynamic else "") + bar + info + " " * max(self._prev_width - plain, 0)
        self._prev_width = plain
        if finalize or self.dynamic:
            self.stream.write(line + ("\n" if finalize else ""))
            self.stream.flush()


class ProgbarLogger(Callback):
    def __init__(self, verbose: int = 1):
        super().__init__()
        self.verbose = verbose

    def on_epoch_begin(self, epoch, logs=None):
        if self.verbose == 1:
            sys.stdout.write(f"Epoch {epoch + 1}/{self.params.get('epochs')}\n")
        self.bar = Progbar(self.params.get("steps"), verbose=self.verbose)

    def on_train_batch_end(self, batch, logs=None):
        self.bar.update(batch + 1, logs or {})

    def on_epoch_end(self, epoch, logs=None):
        self.bar.update(self.params.get("steps"), logs or {}, finalize=True)


class _Monitor(Callback):
    def __init__(self, monitor: str, mode: str, min_delta: float = 0.0):
        super().__init__()
        self.monitor, self.min_delta = monitor, abs(min_delta)
        if mode not in ("auto", "min", "max"):
            mode = "auto"
        if mode == "auto":
            mode = "max" if any(k in monitor for k in ("acc", "auc", "precision", "recall")) else "min"
        self.mode = mode
        self.best = math.inf if mode == "min" else -math.inf

    def improved(self, value: float) -> bool:
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta


class EarlyStopping(_Monitor):
    def __init__(self, monitor: str = "val_loss", min_delta: float = 0.0, patience: int = 0, verbose: int = 0,
                 mode: str = "auto", baseline: Optional[float] = None, restore_best_weights: bool = False,
                 start_from_epoch: int = 0):
        super().__init__(monitor, mode, min_delta)
        self.patience, self.verbose, self.baseline = patience, verbose, baseline
        self.restore_best_weights, self.start_from_epoch = restore_best_weights, start_from_epoch

    def on_train_begin(self, logs=None):
        self.wait, self.stopped_epoch, self.best_weights = 0, 0, None
        self.best = math.inf if self.mode == "min" else -math.inf
        self.best_epoch = 0

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None or epoch < self.start_from_epoch:
            return
        self.wait += 1
        if self.improved(value):
            self.best, self.best_epoch = value, epoch
            if self.restore_best_weights:
                self.best_weights = self.model.get_weights()
            self.wait = 0
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            self.model.stop_training = True
            if self.restore_best_weights and self.best_weights is not None:
                self.model.set_weights(self.best_weights)
            if self.verbose:
                print(f"Epoch {epoch + 1}: early stopping")


class ModelCheckpoint(_Monitor):
    def __init__(self, filepath: str, monitor: str = "val_loss", verbose: int = 0, save_best_only: bool = False,
                 save_weights_only: bool = False, mode: str = "auto", save_freq: str = "epoch",
                 initial_value_threshold: Optional[float] = None):
        super().__init__(monitor, mode)
        self.filepath, self.verbose = str(filepath), verbose
        self.save_best_only, self.save_weights_only = save_best_only, save_weights_only
        if initial_value_threshold is not None:
            self.best = initial_value_threshold

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        path = self.filepath.format(epoch=epoch + 1, **logs)
        if self.save_best_only:
            value = logs.get(self.monitor)
            if value is None or not self.improved(value):
                return
            self.best = value
        if self.save_weights_only:
            self.model.save_weights(path)
        else:
            self.model.save(path)
        if self.verbose:
            print(f"Epoch {epoch + 1}: saving model to {path}")


class ReduceLROnPlateau(_Monitor):
    def __init__(self, monitor: str = "val_loss", factor: float = 0.1, patience: int = 10, verbose: int = 0,
                 mode: str = "auto", min_delta: float = 1e-4, cooldown: int = 0, min_lr: float = 0.0, **_: Any):
        super().__init__(monitor, mode, min_delta)
        self.factor, self.patience, self.verbose, self.cooldown, self.min_lr = factor, patience, verbose, cooldown, min_lr

    def on_train_begin(self, logs=None):
        self.wait, self.cooldown_counter = 0, 0
        self.best = math.inf if self.mode == "min" else -math.inf

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        logs["learning_rate"] = self.model.optimizer.learning_rate
        value = logs.get(self.monitor)
        if value is None:
            return
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.wait = 0
        if self.improved(value):
            self.best, self.wait = value, 0
        elif self.cooldown_counter <= 0:
            self.wait += 1
            if self.wait >= self.patience:
                old = self.model.optimizer.learning_rate
                if old > self.min_lr:
                    new = max(old * self.factor, self.min_lr)
                    self.model.optimizer.learning_rate = new
                    if self.verbose:
                        print(f"Epoch {epoch + 1}: ReduceLROnPlateau reducing learning rate to {new}.")
                    self.cooldown_counter, self.wait = self.cooldown, 0


class LearningRateScheduler(Callback):
    def __init__(self, schedule: Any, verbose: int = 0):
        super().__init__()
        self.schedule, self.verbose = schedule, verbose

    def on_epoch_begin(self, epoch, logs=None):
        lr = self.model.optimizer.learning_rate
        try:
            new = self.schedule(epoch, lr)
        except TypeError:
            new = self.schedule(epoch)
        self.model.optimizer.learning_rate = float(new)
        if self.verbose:
            print(f"\nEpoch {epoch + 1}: LearningRateScheduler setting learning rate to {float(new)}.")

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = self.model.optimizer.learning_rate


class CSVLogger(Callback):
    def __init__(self, filename: str, separator: str = ",", append: bool = False):
        super().__init__()
        self.filename, self.sep, self.append = str(filename), separator, append
        self.keys: Optional[List[str]] = None

    def on_train_begin(self, logs=None):
        self.file = open(self.filename, "a" if self.append else "w", newline="")
        self.writer = None

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if self.writer is None:
            self.keys = sorted(logs)
            self.writer = csv.DictWriter(self.file, fieldnames=["epoch"] + self.keys, delimiter=self.sep)
            if not self.append:
                self.writer.writeheader()
        self.writer.writerow({"epoch": epoch, **{k: logs.get(k, "NA") for k in self.keys}})
        self.file.flush()

    def on_train_end(self, logs=None):
        self.file.close()


class LambdaCallback(Callback):
    def __init__(self, **hooks: Any):
        super().__init__()
        for name, fn in hooks.items():
            setattr(self, name, fn)


class TerminateOnNaN(Callback):
    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and (np.isnan(loss) or np.isinf(loss)):
            print(f"Batch {batch}: Invalid loss, terminating training")
            self.model.stop_training = True


from .tensorboard_callback import TensorBoard  # noqa: E402  (it subclasses Callback, defined above)
