"""The classic Deep Learning Tutorials (lisa-lab/DeepLearningTutorials) run on cgvm.theano and on PyTensor.

Nothing of the tutorials is committed: their ``code/`` is extracted at run time from a local git
mirror of the public repository (``CGVM_DLT_MIRROR``, else the tool mirror under ``/work/.mirror``),
and each tutorial runs in its own subprocess twice:

* **cgvm**: the source with only its ``theano`` imports changed (``import theano`` ->
  ``import cgvm.theano as theano``, ``from theano.x import y`` -> ``from cgvm.theano.x import y``);
* **pytensor**: the source unchanged, with ``theano`` aliased to PyTensor plus the few Theano 1.0
  names PyTensor dropped (``T.nnet.sigmoid``, row-wise ``softmax``, ``MRG_RandomStreams``...).

The data sets (MNIST, ATIS, IMDB, Nottingham) are replaced by tiny synthetic stand-ins written in
the format each loader expects; the ``midi`` package rnnrbm imports is replaced by a stand-in that
reads piano rolls saved with NumPy. ``python -m tests.frontends.theano.dlt_tutorials`` prints the
table of which tutorials run and which print the same numbers on both.
"""
from __future__ import annotations

import gzip
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[3]

#: tutorial -> (module, the call the tutorial's own code/test.py makes, at this data's size)
TUTORIALS: Dict[str, Tuple[str, str]] = {
    "logistic_sgd": ("logistic_sgd", "sgd_optimization_mnist(n_epochs=2)"),
    "logistic_cg": ("logistic_cg", "cg_optimization_mnist(n_epochs=2)"),
    "mlp": ("mlp", "test_mlp(n_epochs=1, n_hidden=50)"),
    "convolutional_mlp": ("convolutional_mlp", "evaluate_lenet5(n_epochs=1, nkerns=[5, 5])"),
    "dA": ("dA", "test_dA(training_epochs=1, output_folder='tmp_dA_plots')"),
    "cA": ("cA", "test_cA(training_epochs=1, output_folder='tmp_cA_plots')"),
    "SdA": ("SdA", "test_SdA(pretraining_epochs=1, training_epochs=1, batch_size=300)"),
    "rbm": ("rbm", "test_rbm(training_epochs=1, batch_size=300, n_chains=1, n_samples=1, n_hidden=20, "
                   "output_folder='tmp_rbm_plots')"),
    "DBN": ("DBN", "test_DBN(pretraining_epochs=1, training_epochs=1, batch_size=300)"),
    "lstm": ("lstm", "train_lstm(max_epochs=1, test_size=40, saveto='', validFreq=5, dispFreq=5)"),
    "rnnslu": ("rnnslu", "main({'fold': 3, 'data': 'atis', 'lr': 0.0970806646812754, 'verbose': 1, "
                         "'decay': True, 'win': 7, 'nhidden': 200, 'seed': 345, 'emb_dimension': 50, "
                         "'nepochs': 1, 'savemodel': False})"),
    "rnnrbm": ("rnnrbm", "test_rnnrbm(num_epochs=1)"),
    "hmc": ("hmc.test_hmc", "test_hmc()"),
}

#: tutorials whose numbers depend only on NumPy's seeded generator (no symbolic random streams),
#: so cgvm and PyTensor must print the same numbers
DETERMINISTIC = ("logistic_sgd", "logistic_cg", "mlp", "convolutional_mlp", "rnnslu", "cA")


def find_mirror() -> Optional[Path]:
    """A git directory of lisa-lab/DeepLearningTutorials, or None."""
    from tests.shared_paths import PEERS

    for cand in (os.environ.get("CGVM_DLT_MIRROR"), "/work/.mirror/lisa-lab+DeepLearningTutorials/repo/.git",
                 PEERS / "lisa-lab+DeepLearningTutorials"):
        if cand and Path(cand).is_dir():
            return Path(cand)
    return None


def extract(mirror: Path, dest: Path) -> None:
    """Write the tutorials' ``code/`` tree from the mirror's HEAD into ``dest/code``."""
    names = subprocess.run(["git", f"--git-dir={mirror}", "ls-tree", "-r", "--name-only", "HEAD", "code"],
                           check=True, capture_output=True, text=True).stdout.split()
    for name in names:
        if not (name.endswith(".py") or name.endswith(".pl")) or name.count("/") > 2:
            continue
        blob = subprocess.run(["git", f"--git-dir={mirror}", "show", f"HEAD:{name}"], check=True,
                              capture_output=True).stdout
        out = dest / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(blob)


_IMPORT = re.compile(r"^(\s*)import theano((?:\.[\w.]+)?)(\s+as\s+\w+)?\s*$")
_FROM = re.compile(r"^(\s*)from theano((?:\.[\w.]+)?) import ")


def change_imports(source: str) -> str:
    """Only the ``theano`` import lines rewritten to ``cgvm.theano``."""
    out = []
    for line in source.splitlines():
        m = _IMPORT.match(line)
        if m:
            indent, sub, alias = m.group(1), m.group(2), m.group(3)
            if alias:
                line = f"{indent}import cgvm.theano{sub}{alias}"
            elif sub:
                line = f"{indent}import cgvm.theano{sub}; import cgvm.theano as theano"
            else:
                line = f"{indent}import cgvm.theano as theano"
        else:
            line = _FROM.sub(lambda m: f"{m.group(1)}from cgvm.theano{m.group(2)} import ", line)
        out.append(line)
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- synthetic data sets


def write_data(data: Path) -> None:
    """Tiny stand-ins of MNIST, ATIS fold 3, IMDB and Nottingham in the tutorials' formats."""
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(1234)
    protos = rng.rand(10, 784)

    def mnist_split(n):
        y = rng.randint(0, 10, n)
        x = np.clip(protos[y] + 0.3 * rng.randn(n, 784), 0, 1).astype(np.float32)
        return x, y.astype(np.int64)

    with gzip.open(data / "mnist.pkl.gz", "wb") as f:
        pickle.dump((mnist_split(1200), mnist_split(600), mnist_split(600)), f, protocol=2)

    labels = {"O": 0, "B-city": 1, "I-city": 2, "B-date": 3, "I-date": 4}
    words = {f"w{i}": i for i in range(60)}

    def atis_split(n):
        lex, ne, y = [], [], []
        for _ in range(n):
            length = rng.randint(4, 9)
            w = rng.randint(0, 60, length).astype(np.int32)
            tags = np.where(w < 12, 1, np.where(w < 20, 3, 0)).astype(np.int32)
            lex.append(w), ne.append(np.zeros(length, np.int32)), y.append(tags)
        return lex, ne, y

    with gzip.open(data / "atis.fold3.pkl.gz", "wb") as f:
        pickle.dump((atis_split(30), atis_split(8), atis_split(8), {"labels2idx": labels, "words2idx": words}),
                    f, protocol=2)

    def imdb_split(n):
        xs = [list(rng.randint(2, 500, rng.randint(5, 20))) for _ in range(n)]
        return xs, [int(sum(x) % 2) for x in xs]

    with open(data / "imdb.pkl", "wb") as f:
        pickle.dump(imdb_split(60), f, protocol=2)
        pickle.dump(imdb_split(40), f, protocol=2)

    notts = data / "Nottingham" / "train"
    notts.mkdir(parents=True, exist_ok=True)
    for k in range(2):
        roll = (rng.rand(30 + 10 * k, 88) < 0.08).astype(np.float64)
        np.save(notts / f"tune{k}.mid.npy", roll)
        (notts / f"tune{k}.mid").write_text(f"stand-in: piano roll in tune{k}.mid.npy\n")


_MIDI_STANDIN = '''"""Stand-in for the midi package: piano rolls saved with NumPy beside the .mid name."""
import numpy


class midiread(object):
    def __init__(self, filename, r=(21, 109), dt=0.2):
        self.piano_roll = numpy.load(filename + ".npy")


def midiwrite(filename, piano_roll, r=(21, 109), dt=0.2):
    numpy.save(filename + ".npy", piano_roll)
'''

#: the Theano 1.0 names the tutorials use that PyTensor dropped, put back over PyTensor's own ops
_PYTENSOR_SHIM = '''
import sys, types
import pytensor, pytensor.tensor as pt, pytensor.ifelse, pytensor.scan
from pytensor.tensor.random.utils import RandomStream

def _softmax(x):
    x = pt.as_tensor_variable(x)
    return pt.special.softmax(x.dimshuffle("x", 0) if x.ndim == 1 else x, axis=-1)

def _conv2d(input, filters, input_shape=None, filter_shape=None, border_mode="valid", subsample=(1, 1),
            filter_flip=True, **kw):
    raise NotImplementedError("PyTensor has no conv2d")

class MRG_RandomStreams(RandomStream):
    def binomial(self, size=None, n=1, p=0.5, dtype="int64", nstreams=None):
        return super().binomial(n, p, size=size).astype(dtype)
    def normal(self, size=None, avg=0.0, std=1.0, dtype=None, nstreams=None):
        return super().normal(avg, std, size=size).astype(dtype or pytensor.config.floatX)
    def uniform(self, size=None, low=0.0, high=1.0, dtype=None, nstreams=None):
        return super().uniform(low, high, size=size).astype(dtype or pytensor.config.floatX)

nnet = types.ModuleType("theano.tensor.nnet")
nnet.sigmoid, nnet.softmax, nnet.softplus, nnet.conv2d = pt.sigmoid, _softmax, pt.softplus, _conv2d
nnet.categorical_crossentropy = lambda p, t: -pt.log(p)[pt.arange(t.shape[0]), t]
nnet.binary_crossentropy = lambda o, t: -(t * pt.log(o) + (1 - t) * pt.log(1 - o))
pt.nnet = nnet
rng_mrg = types.ModuleType("theano.sandbox.rng_mrg")
rng_mrg.MRG_RandomStreams = MRG_RandomStreams
sandbox = types.ModuleType("theano.sandbox")
sandbox.rng_mrg = rng_mrg
pytensor.sandbox = sandbox
srs = types.ModuleType("theano.tensor.shared_randomstreams")
srs.RandomStreams = MRG_RandomStreams
for name, mod in {"theano": pytensor, "theano.tensor": pt, "theano.tensor.nnet": nnet, "theano.sandbox": sandbox,
                  "theano.sandbox.rng_mrg": rng_mrg, "theano.ifelse": pytensor.ifelse,
                  "theano.tensor.shared_randomstreams": srs}.items():
    sys.modules[name] = mod
'''


def prepare(root: Path, mirror: Path) -> Dict[str, Path]:
    """Extract the tutorials twice (cgvm imports / unchanged) beside one data folder; the code dirs."""
    write_data(root / "data")
    dirs = {}
    for backend in ("cgvm", "pytensor"):
        base = root / backend
        extract(mirror, base)
        code = base / "code"
        (base / "data").exists() or (base / "data").symlink_to(root / "data", target_is_directory=True)
        (code / "midi").mkdir(exist_ok=True)
        (code / "midi" / "__init__.py").write_text("")
        (code / "midi" / "utils.py").write_text(_MIDI_STANDIN)
        if backend == "cgvm":
            for py in code.rglob("*.py"):
                py.write_text(change_imports(py.read_text()))
        else:
            (code / "_theano_is_pytensor.py").write_text(_PYTENSOR_SHIM)
        dirs[backend] = code
    return dirs


def run_one(code: Path, backend: str, name: str, timeout: float = 900) -> Tuple[bool, str]:
    """Run one tutorial's call in a fresh interpreter; (it finished, its output)."""
    module, call = TUTORIALS[name]
    prelude = "import _theano_is_pytensor\n" if backend == "pytensor" else ""
    if backend == "pytensor":
        prelude += "import pytensor; pytensor.config.floatX = 'float64'\n"
    script = (prelude + "import numpy, importlib\nnumpy.random.seed(123)\n"
              f"m = importlib.import_module({module!r})\nm.{call}\nprint('TUTORIAL-DONE')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code), str(REPO)]),
               ATISDATA=str(code.parent / "data"), PYTHONHASHSEED="0")
    try:
        proc = subprocess.run([sys.executable, "-c", script], cwd=code, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return False, f"timeout after {timeout}s\n{e.stdout or ''}"
    out = proc.stdout + proc.stderr
    return proc.returncode == 0 and "TUTORIAL-DONE" in proc.stdout, out


_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_TIMING = re.compile(r"ran for|epochs/sec|seconds|minutes|time|Training took|took", re.I)


def numbers(output: str) -> List[float]:
    """The numbers a tutorial printed, leaving out timing lines and the tutorial's own banner."""
    vals = []
    for line in output.splitlines():
        if _TIMING.search(line) or line.startswith(("{", "[learning]", "...")):
            continue
        vals += [float(v) for v in _NUMBER.findall(line)]
    return vals


def same_numbers(a: str, b: str, rtol: float = 1e-6) -> bool:
    na, nb = numbers(a), numbers(b)
    return len(na) == len(nb) and len(na) > 0 and np.allclose(na, nb, rtol=rtol, atol=1e-9)


def main(argv: List[str]) -> int:
    import tempfile

    mirror = find_mirror()
    if mirror is None:
        print("no DeepLearningTutorials mirror (set CGVM_DLT_MIRROR)")
        return 1
    names = argv or list(TUTORIALS)
    with tempfile.TemporaryDirectory() as tmp:
        dirs = prepare(Path(tmp), mirror)
        for name in names:
            ok_c, out_c = run_one(dirs["cgvm"], "cgvm", name)
            ok_p, out_p = run_one(dirs["pytensor"], "pytensor", name)
            same = ok_c and ok_p and same_numbers(out_c, out_p)
            print(f"{name:18s} cgvm={'ok' if ok_c else 'FAIL'} pytensor={'ok' if ok_p else 'FAIL'} "
                  f"same_numbers={same}", flush=True)
            if not ok_c:
                print("   cgvm: " + "\n   ".join(out_c.strip().splitlines()[-6:]), flush=True)
            if not ok_p and os.environ.get("DLT_SHOW_PEER"):
                print("   pytensor: " + "\n   ".join(out_p.strip().splitlines()[-6:]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
