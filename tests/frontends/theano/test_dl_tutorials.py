"""The 13 classic Deep Learning Tutorials run on cgvm.theano with only their imports changed.

The tutorials' code is extracted at test time from a local mirror of lisa-lab/DeepLearningTutorials
(skipped when there is none; see dlt_tutorials.py); their data sets are tiny synthetic stand-ins.
Those whose numbers depend only on NumPy's seeded generator must print PyTensor's numbers.
"""
import importlib.util

import pytest

import dlt_tutorials as dlt

MIRROR = dlt.find_mirror()
pytestmark = pytest.mark.skipif(MIRROR is None, reason="no DeepLearningTutorials mirror (set CGVM_DLT_MIRROR)")
HAVE_PYTENSOR = importlib.util.find_spec("pytensor") is not None
#: comparable with PyTensor: deterministic, and using no op PyTensor dropped (conv2d, pool)
COMPARED = [n for n in dlt.DETERMINISTIC if n != "convolutional_mlp"]


@pytest.fixture(scope="module")
def code_dirs(tmp_path_factory):
    return dlt.prepare(tmp_path_factory.mktemp("dlt"), MIRROR)


@pytest.mark.parametrize("name", list(dlt.TUTORIALS))
def test_tutorial_runs_unchanged(code_dirs, name):
    ok, out = dlt.run_one(code_dirs["cgvm"], "cgvm", name)
    assert ok, f"{name} failed on cgvm:\n{out[-3000:]}"
    if name == "logistic_sgd":  # the tutorial pickles its best model
        assert (code_dirs["cgvm"] / "best_model.pkl").stat().st_size > 0
    if name in COMPARED and HAVE_PYTENSOR:
        ok_p, out_p = dlt.run_one(code_dirs["pytensor"], "pytensor", name)
        assert ok_p, f"{name} failed on PyTensor:\n{out_p[-2000:]}"
        assert dlt.same_numbers(out, out_p), (f"{name}: cgvm and PyTensor print different numbers\n"
                                              f"cgvm: {dlt.numbers(out)[:40]}\npytensor: {dlt.numbers(out_p)[:40]}")


def test_import_rewrite_changes_only_theano_imports():
    src = ("import theano\nimport theano.tensor as T\nfrom theano.tensor.nnet import conv2d\n"
           "import theano.sandbox.rng_mrg\nx = theano.shared(1)\n")
    out = dlt.change_imports(src).splitlines()
    assert out == ["import cgvm.theano as theano", "import cgvm.theano.tensor as T",
                   "from cgvm.theano.tensor.nnet import conv2d",
                   "import cgvm.theano.sandbox.rng_mrg; import cgvm.theano as theano", "x = theano.shared(1)"]
