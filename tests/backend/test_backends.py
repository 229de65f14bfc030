"""Backend selection: NumPy by default, CuPy by name or $CGVM_BACKEND, clear errors when unavailable."""
import importlib.util

import numpy as np
import pytest

import cgvm
from cgvm.backend import base
from cgvm.errors import BackendUnavailable


def test_numpy_is_the_default(monkeypatch):
    monkeypatch.delenv("CGVM_BACKEND", raising=False)
    assert cgvm.get_backend().name == "numpy"
    assert "numpy" in cgvm.available_backends()


def test_env_selects_the_backend(monkeypatch):
    monkeypatch.setenv("CGVM_BACKEND", "numpy")
    assert cgvm.Workspace().backend.name == "numpy"


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(BackendUnavailable, match="unknown backend 'tpu'"):
        cgvm.get_backend("tpu")


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_cupy_without_cupy_says_how_to_install(monkeypatch):
    base._BACKENDS.pop("cupy", None)
    with pytest.raises(BackendUnavailable, match=r"pip install 'cgvm\[gpu\]'"):
        cgvm.get_backend("cupy")
    with pytest.raises(BackendUnavailable):
        cgvm.Workspace("gpu")


def test_numpy_backend_accepts_dlpack_producers_without_copy():
    torch = pytest.importorskip("torch")
    t = torch.arange(3, dtype=torch.float32)
    arr = cgvm.get_backend("numpy").asarray(t)
    t[1] = 7.0
    assert arr[1] == 7.0 and isinstance(arr, np.ndarray)
