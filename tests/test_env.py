"""Environment switches: opt-ins that let a file run code are on only when spelled on; the memory limit."""
import os
import textwrap

import numpy as np
import pytest

from cgvm.env import check_bytes, env_flag, max_bytes, parse_bytes
from cgvm.errors import ConfigError, ResourceLimitError

ON = ["1", "true", "True", "TRUE", "yes", "Yes", "YES", " true "]
OFF = ["0", "false", "False", "FALSE", "no", "No", "off", "OFF", "Off", ""]
NEITHER = ["2", "maybe", "on", "enable", "y", "t", "-1", "truee"]


@pytest.mark.parametrize("value", ON)
def test_flag_on(monkeypatch, value):
    monkeypatch.setenv("CGVM_TEST_FLAG", value)
    assert env_flag("CGVM_TEST_FLAG") is True


@pytest.mark.parametrize("value", OFF)
def test_flag_off(monkeypatch, value):
    monkeypatch.setenv("CGVM_TEST_FLAG", value)
    assert env_flag("CGVM_TEST_FLAG") is False


def test_flag_unset_is_off(monkeypatch):
    monkeypatch.delenv("CGVM_TEST_FLAG", raising=False)
    assert env_flag("CGVM_TEST_FLAG") is False


@pytest.mark.parametrize("value", NEITHER)
def test_flag_other_values_are_errors_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("CGVM_TEST_FLAG", value)
    with pytest.raises(ConfigError, match="CGVM_TEST_FLAG"):
        env_flag("CGVM_TEST_FLAG")


# ----------------------------------------------------------------------------- Python layers

LAYER = '''
import cgvm.caffe as caffe

class Double(caffe.Layer):
    def setup(self, bottom, top):
        pass
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)
    def forward(self, bottom, top):
        top[0].data[...] = 2 * bottom[0].data
    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = 2 * top[0].diff
'''

NET = ('input: "data" input_shape { dim: 2 dim: 3 }\n'
       'layer { type: "Python" name: "p" bottom: "data" top: "p" '
       'python_param { module: "cgvm_env_test_layer" layer: "Double" } }\n')


@pytest.fixture
def python_layer_module(tmp_path, monkeypatch):
    import sys

    (tmp_path / "cgvm_env_test_layer.py").write_text(textwrap.dedent(LAYER))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("cgvm_env_test_layer", None)


@pytest.mark.parametrize("value", ON)
def test_python_layers_run_when_the_variable_says_on(python_layer_module, monkeypatch, value):
    import cgvm.caffe as caffe

    monkeypatch.setenv("CGVM_ALLOW_PYTHON_LAYERS", value)
    net = caffe.Net(NET, caffe.TEST)
    net.blobs["data"].data[...] = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(net.forward()["p"], 2 * np.arange(6).reshape(2, 3))


@pytest.mark.parametrize("value", OFF)
def test_python_layers_stay_off_for_every_off_spelling(python_layer_module, monkeypatch, value):
    """The bug of issue 20: CGVM_ALLOW_PYTHON_LAYERS=false (False, no, off) turned them on."""
    import cgvm.caffe as caffe
    from cgvm.frontends.caffe.errors import CaffeNetError

    monkeypatch.setenv("CGVM_ALLOW_PYTHON_LAYERS", value)
    with pytest.raises(CaffeNetError, match="allow_python_layers=True"):
        caffe.Net(NET, caffe.TEST)


@pytest.mark.parametrize("value", NEITHER)
def test_python_layers_unclear_value_is_an_error(python_layer_module, monkeypatch, value):
    import cgvm.caffe as caffe

    monkeypatch.setenv("CGVM_ALLOW_PYTHON_LAYERS", value)
    with pytest.raises(ConfigError, match="CGVM_ALLOW_PYTHON_LAYERS"):
        caffe.Net(NET, caffe.TEST)


def test_explicit_argument_wins_over_the_environment(python_layer_module, monkeypatch):
    import cgvm.caffe as caffe
    from cgvm.frontends.caffe.errors import CaffeNetError

    monkeypatch.setenv("CGVM_ALLOW_PYTHON_LAYERS", "yes")
    with pytest.raises(CaffeNetError):
        caffe.Net(NET, caffe.TEST, allow_python_layers=False)


def test_every_code_opt_in_is_read_through_env_flag():
    """No module reads a CGVM_ALLOW_* variable from os.environ itself."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1] / "cgvm"
    offenders = [str(p) for p in root.rglob("*.py")
                 if re.search(r"environ(\.get)?\(?\[?[\"']CGVM_ALLOW", p.read_text(encoding="utf-8"))]
    assert offenders == []


# ----------------------------------------------------------------------------- the memory limit

@pytest.mark.parametrize("text, value", [("4096", 4096), ("512M", 512 << 20), ("8G", 8 << 30), ("8GiB", 8 << 30),
                                         ("1.5k", 1536), ("2T", 2 << 40)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-1", "0", "8X", "1e9"])
def test_parse_bytes_refuses_nonsense(text):
    with pytest.raises(ConfigError, match="CGVM_MAX_BYTES"):
        parse_bytes(text)


def test_max_bytes_default_is_a_fraction_of_the_machine(monkeypatch):
    monkeypatch.delenv("CGVM_MAX_BYTES", raising=False)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert max_bytes() == total // 2
    monkeypatch.setenv("CGVM_MAX_BYTES", "3M")
    assert max_bytes() == 3 << 20


def test_check_bytes_says_how_much_and_what(monkeypatch):
    monkeypatch.setenv("CGVM_MAX_BYTES", "1M")
    check_bytes(1 << 20, "small")
    with pytest.raises(ResourceLimitError, match=r"net\.prototxt needs 32 TiB.*limit of 1 MiB.*ip1 32 TiB"):
        check_bytes(32 << 40, "net.prototxt", parts=[("ip1", 32 << 40), ("conv", 10)])


def test_backend_variable_is_checked_by_every_entry_point(monkeypatch):
    """CGVM_BACKEND with a name no backend has is an error for the core API and pycaffe alike."""
    import cgvm
    import cgvm.caffe as caffe
    from cgvm.backend import base
    from cgvm.errors import BackendUnavailable

    from cgvm.frontends.caffe import pycaffe

    monkeypatch.setenv("CGVM_BACKEND", "tpu")
    monkeypatch.setattr(base, "_BACKENDS", {})
    monkeypatch.setitem(pycaffe._mode, "backend", None)   # as before any set_mode_* call (other tests make some)
    with pytest.raises(BackendUnavailable, match="'tpu' .from the environment variable CGVM_BACKEND"):
        cgvm.Workspace()
    with pytest.raises(BackendUnavailable, match="CGVM_BACKEND"):
        caffe.Net('input: "x" input_shape { dim: 1 }', caffe.TEST)
    monkeypatch.setenv("CGVM_BACKEND", "numpy")
    assert caffe.Net('input: "x" input_shape { dim: 1 }', caffe.TEST).workspace.backend.name == "numpy"
