"""Helpers for the Caffe layer tests: one-layer nets over Input blobs and Caffe's gradient check."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

from cgvm.frontends.caffe.pycaffe import Net


def one_layer_net(layer_body: str, bottom_shapes: Sequence[Sequence[int]], n_tops: int = 1, phase: int = 1,
                  dtype=np.float64, seed: int = 1701, extra: str = "", **kwargs) -> Net:
    """A net: an Input layer with tops b0, b1, ... then the layer under test reading them (tops t0, ...)."""
    shapes = "".join("shape { " + " ".join(f"dim: {d}" for d in s) + " } " for s in bottom_shapes)
    bottoms = "".join(f'top: "b{i}" ' for i in range(len(bottom_shapes)))
    uses = "".join(f'bottom: "b{i}" ' for i in range(len(bottom_shapes)))
    tops = "".join(f'top: "t{i}" ' for i in range(n_tops))
    inputs = f'layer {{ name: "input" type: "Input" {bottoms} input_param {{ {shapes} }} }}\n' if bottom_shapes else ""
    text = (f'force_backward: true\n{inputs}'
            f'layer {{ name: "under_test" {uses}{tops} {layer_body} }}\n{extra}')
    return Net(text, phase, dtype=dtype, seed=seed, **kwargs)


def check_gradients(net: Net, check_bottoms: Sequence[int], *, step: float = 1e-6, tol: float = 1e-5,
                    seed: int = 0, check_params: bool = True) -> None:
    """Caffe's GradientChecker in float64: analytic (net.backward) against central differences.

    The objective is sum over tops of <R_t, top> with random R_t (the tops' diffs). Passes when
    |analytic - numeric| <= tol * max(|analytic|, |numeric|, 1) for every element.
    """
    rng = np.random.default_rng(seed)
    net.forward()
    tops = [n for n in net.outputs if net.blobs[n].data.dtype.kind == "f"]
    seeds: Dict[str, np.ndarray] = {t: rng.normal(size=net.blobs[t].shape) for t in tops}

    def objective() -> float:
        net.forward()
        return float(sum((seeds[t] * net.blobs[t].data).sum() for t in tops))

    net.forward()
    for t in tops:
        net.blobs[t].diff[...] = seeds[t]
    net.clear_param_diffs()
    net.backward()
    targets = [(f"bottom b{i}", net.blobs[f"b{i}"]) for i in check_bottoms]
    if check_params:
        targets += [(f"{layer} param {k}", blob) for layer, blobs in net.params.items() for k, blob in enumerate(blobs)]
    analytic = [blob.diff.copy() for _, blob in targets]
    for (label, blob), expected in zip(targets, analytic):
        data = blob.data
        for index in np.ndindex(data.shape):
            original = data[index]
            data[index] = original + step
            up = objective()
            data[index] = original - step
            down = objective()
            data[index] = original
            numeric = (up - down) / (2 * step)
            got = expected[index]
            scale = max(abs(got), abs(numeric), 1.0)
            assert abs(got - numeric) <= tol * scale, (
                f"{label}{list(index)}: analytic {got:.8g}, numeric {numeric:.8g}")


def fill_inputs(net: Net, values: Optional[Dict[int, np.ndarray]] = None, seed: int = 1701) -> None:
    """Gaussian data into every b<i> blob unless ``values`` gives it."""
    rng = np.random.default_rng(seed)
    values = values or {}
    i = 0
    while f"b{i}" in net.blobs:
        blob = net.blobs[f"b{i}"]
        blob.data[...] = values[i] if i in values else rng.normal(size=blob.shape)
        i += 1
