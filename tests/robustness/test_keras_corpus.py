"""Malformed Keras files, each written here from a valid one: every load fails with a KerasConfigError
that names the file and what in it is wrong, chains the library's error where one was raised, and
leaves the target untouched (a failed ``load_model`` leaves no variables; ``load_weights`` leaves
every weight as it was).

The kinds: damaged ``.keras`` archives, config values of the wrong type (``dtype.config = 1``,
``inbound_nodes = true``, ``input_layers`` as a string), JSON nested too deep, sizes past the byte
limit (``units = 2**31``, ``10**12``), corrupt or mismatched HDF5 weights (wrong dtype, wrong
shape, missing datasets, data stored outside the file), a path given to ``model_from_json``, a
directory given as a file, and an HDF5 read that does not finish in time.
"""
from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

import cgvm.keras as keras  # noqa: E402
from cgvm.errors import CgvmError  # noqa: E402
from cgvm.frontends.keras import backend as K  # noqa: E402
from cgvm.frontends.keras.serialization import KerasConfigError  # noqa: E402
from cgvm.vm import Workspace  # noqa: E402

L = keras.layers


@pytest.fixture(autouse=True)
def fresh_workspace():
    """Each test's Keras variables in a Workspace of its own, so 'no variables left' can be checked."""
    ws = Workspace()
    K.set_workspace(ws)
    yield ws
    K.set_workspace(None)


def functional() -> Any:
    a = keras.Input((5, 3), name="in_a")
    h = L.Conv1D(2, 2, padding="same", name="conv")(a)
    h = L.BatchNormalization(name="bn")(L.GlobalAveragePooling1D(name="pool")(h))
    return keras.Model(a, L.Dense(2, name="head")(h), name="corpus_func")


def sequential() -> Any:
    return keras.Sequential([keras.Input((4,)), L.Dense(3, activation="relu", name="d1"), L.Dense(2, name="d2")],
                            name="corpus_seq")


def fingerprint(model: Any) -> list:
    return [(w.path, w.numpy().copy()) for w in model.weights]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(pa == pb and np.array_equal(x, y) for (pa, x), (pb, y) in zip(a, b))


def failed_load(path: Path, match: str, workspace: Workspace, **kwargs: Any) -> KerasConfigError:
    """load_model(path) must raise a KerasConfigError naming the file and matching ``match``; no variables left."""
    before = set(workspace.keys())
    with pytest.raises(KerasConfigError, match=match) as info:
        keras.load_model(path, **kwargs)
    assert path.name in str(info.value)
    assert set(workspace.keys()) == before, "a failed load left variables behind"
    return info.value


# ----------------------------------------------------------------------------- .keras archives

def rewrite_archive(src: Path, dst: Path, edit: Callable[[Dict[str, bytes]], None]) -> Path:
    with zipfile.ZipFile(src) as z:
        members = {n: z.read(n) for n in z.namelist()}
    edit(members)
    with zipfile.ZipFile(dst, "w") as z:
        for n, v in members.items():
            z.writestr(n, v)
    return dst


def edit_config(src: Path, dst: Path, change: Callable[[Dict[str, Any]], None]) -> Path:
    def edit(members: Dict[str, bytes]) -> None:
        config = json.loads(members["config.json"])
        change(config)
        members["config.json"] = json.dumps(config).encode()
    return rewrite_archive(src, dst, edit)


@pytest.fixture
def saved(tmp_path):
    model = functional()
    model.save(tmp_path / "ok.keras")
    return tmp_path / "ok.keras"


def layer_entry(config: Dict[str, Any], name: str) -> Dict[str, Any]:
    return next(e for e in config["config"]["layers"] if e.get("name") == name or e["config"].get("name") == name)


CONFIG_EDITS = {
    # (change to config.json, what the message must say)
    "dtype_config_is_int": (lambda c: layer_entry(c, "head")["config"].__setitem__(
        "dtype", {"module": "keras", "class_name": "DTypePolicy", "config": 1}), "head"),
    "inbound_nodes_true": (lambda c: layer_entry(c, "head").__setitem__("inbound_nodes", True), "inbound_nodes"),
    "inbound_node_item_true": (lambda c: layer_entry(c, "head").__setitem__("inbound_nodes", [[True]]),
                               "inbound node"),
    "input_layers_string": (lambda c: c["config"].__setitem__("input_layers", "in_a"), "input_layers"),
    "output_layers_unknown": (lambda c: c["config"].__setitem__("output_layers", ["nope", 0, 0]), "nope"),
    "history_negative": (lambda c: c["config"].__setitem__("output_layers", ["head", 0, -1]), "negative"),
    "units_2_31": (lambda c: layer_entry(c, "head")["config"].__setitem__("units", 2 ** 31), "limit"),
    "units_10_12": (lambda c: layer_entry(c, "head")["config"].__setitem__("units", 10 ** 12), "limit"),
    "units_negative": (lambda c: layer_entry(c, "head")["config"].__setitem__("units", -3), "negative"),
    "units_string": (lambda c: layer_entry(c, "head")["config"].__setitem__("units", "many"), "head"),
    "kernel_size_huge": (lambda c: layer_entry(c, "conv")["config"].__setitem__("kernel_size", [10 ** 12]),
                         "conv"),
    "layers_not_a_list": (lambda c: c["config"].__setitem__("layers", {"a": 1}), "layers"),
    "layer_entry_int": (lambda c: c["config"]["layers"].append(7), r"layers\[\d+\]"),
    "layer_name_list": (lambda c: layer_entry(c, "head")["config"].__setitem__("name", ["head"]), "name"),
    "class_name_int": (lambda c: layer_entry(c, "head").__setitem__("class_name", 5), "class_name"),
    "unknown_layer": (lambda c: layer_entry(c, "head").__setitem__("class_name", "NoSuchLayer"), "NoSuchLayer"),
    "batch_shape_string": (lambda c: layer_entry(c, "in_a")["config"].__setitem__("batch_shape", "abc"),
                           "batch_shape"),
    "model_config_is_list_of_ints": (lambda c: c.__setitem__("config", [1, 2]), "model"),
}


@pytest.mark.parametrize("case", list(CONFIG_EDITS))
def test_config_value_of_the_wrong_type(saved, tmp_path, fresh_workspace, case):
    change, match = CONFIG_EDITS[case]
    bad = edit_config(saved, tmp_path / f"{case}.keras", change)
    failed_load(bad, match, fresh_workspace)


def test_units_past_the_limit_say_how_much(saved, tmp_path, fresh_workspace):
    bad = edit_config(saved, tmp_path / "huge.keras",
                      lambda c: layer_entry(c, "head")["config"].__setitem__("units", 10 ** 12))
    err = failed_load(bad, "CGVM_MAX_BYTES", fresh_workspace)
    assert "head" in str(err) and "TiB" in str(err)


def test_limit_is_configurable(saved, fresh_workspace, monkeypatch):
    text = functional().to_json()
    monkeypatch.setenv("CGVM_MAX_BYTES", "100")  # the archive's members are larger than that
    failed_load(saved, r"limit of 100\b", fresh_workspace)
    monkeypatch.setenv("CGVM_MAX_BYTES", "60")  # conv kernel 48 bytes, + bias 8, + BN's first 8: over
    with pytest.raises(KerasConfigError, match=r"'bn'.* \(64 bytes with the weights before it\), more than the limit of 60"):
        keras.model_from_json(text)
    monkeypatch.setenv("CGVM_MAX_BYTES", "lots")
    with pytest.raises(KerasConfigError, match="CGVM_MAX_BYTES"):
        keras.load_model(saved)
    monkeypatch.setenv("CGVM_MAX_BYTES", "1M")
    assert keras.load_model(saved).name == "corpus_func"


def test_json_nested_too_deep(saved, tmp_path, fresh_workspace):
    def edit(members):
        members["config.json"] = members["config.json"][:-1] + b', "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    failed_load(rewrite_archive(saved, tmp_path / "deep.keras", edit), "nested 5001 deep", fresh_workspace)


def test_config_not_json(saved, tmp_path, fresh_workspace):
    err = failed_load(rewrite_archive(saved, tmp_path / "nojson.keras",
                                      lambda m: m.__setitem__("config.json", b"{'layers': ")),
                      "config.json is not valid JSON", fresh_workspace)
    assert isinstance(err.__cause__, json.JSONDecodeError)


def test_config_not_utf8(saved, tmp_path, fresh_workspace):
    failed_load(rewrite_archive(saved, tmp_path / "latin.keras", lambda m: m.__setitem__("config.json", b"\xff{}")),
                "not UTF-8", fresh_workspace)


def test_archive_without_config(saved, tmp_path, fresh_workspace):
    failed_load(rewrite_archive(saved, tmp_path / "noconf.keras", lambda m: m.pop("config.json")),
                "without config.json", fresh_workspace)


def test_archive_member_larger_than_the_limit(saved, fresh_workspace, monkeypatch):
    monkeypatch.setenv("CGVM_MAX_BYTES", "1000")
    failed_load(saved, r"(config\.json|model\.weights\.h5) claims \d+ bytes", fresh_workspace)


def test_damaged_archive(saved, tmp_path, fresh_workspace):
    data = bytearray(saved.read_bytes())
    at = data.find(b"config.json", 40) + 40  # inside config.json's data: the CRC no longer matches
    data[at:at + 4] = b"!!!!"
    bad = tmp_path / "crc.keras"
    bad.write_bytes(bytes(data))
    err = failed_load(bad, "not a readable .keras archive", fresh_workspace)
    assert isinstance(err.__cause__, zipfile.BadZipFile)


@pytest.mark.parametrize("how", ["truncated", "zeroed", "garbage"])
def test_corrupt_weights_inside_archive(saved, tmp_path, fresh_workspace, how):
    def edit(members):
        w = bytearray(members["model.weights.h5"])
        if how == "truncated":
            w = w[:len(w) // 2]
        elif how == "zeroed":
            w[600:4000] = bytes(3400)
        else:
            w = b"not hdf5 at all" * 10
        members["model.weights.h5"] = bytes(w)
    failed_load(rewrite_archive(saved, tmp_path / f"{how}.keras", edit), "model.weights.h5", fresh_workspace)


def test_corrupt_hdf5_chains_the_library_error(saved, tmp_path, fresh_workspace):
    def edit(members):
        members["model.weights.h5"] = members["model.weights.h5"][:3000]
    err = failed_load(rewrite_archive(saved, tmp_path / "cut.keras", edit), "model.weights.h5", fresh_workspace)
    assert isinstance(err.__cause__, OSError)  # h5py's OSError, rebuilt from the worker's report


def weights_edit(saved: Path, dst: Path, change: Callable[[Any], None]) -> Path:
    def edit(members):
        buf = io.BytesIO(members["model.weights.h5"])
        with h5py.File(buf, "a") as h5:
            change(h5)
        members["model.weights.h5"] = buf.getvalue()
    return rewrite_archive(saved, dst, edit)


def replace_dataset(h5: Any, path: str, data: Any) -> None:
    del h5[path]
    h5[path] = data


WEIGHT_EDITS = {
    "wrong_shape": (lambda h5: replace_dataset(h5, "layers/dense/vars/0", np.zeros((3, 3), np.float32)), "shape"),
    "strings": (lambda h5: replace_dataset(h5, "layers/dense/vars/1", np.array([b"ab", b"cd"])), "dtype"),
    "compound": (lambda h5: replace_dataset(h5, "layers/dense/vars/1", np.zeros(2, [("a", "f4"), ("b", "i2")])),
                 "dtype"),
    "missing_dataset": (lambda h5: h5["layers/dense/vars"].move("1", "7"), "head"),
    "missing_group": (lambda h5: h5.__delitem__("layers/batch_normalization"), "bn"),
    "soft_link": (lambda h5: (h5["layers/dense/vars"].__delitem__("1"),
                              h5["layers/dense/vars"].__setitem__("1", h5py.SoftLink("/elsewhere"))), "link"),
    "external_link": (lambda h5: (h5["layers/dense/vars"].__delitem__("1"), h5["layers/dense/vars"].__setitem__(
        "1", h5py.ExternalLink("/etc/passwd", "/"))), "is a link"),
    "huge_compressed": (lambda h5: (h5["layers/dense/vars"].__delitem__("1"), h5["layers/dense/vars"].create_dataset(
        "1", shape=(2 ** 40,), dtype="f8", chunks=(1024,), compression="gzip")), "shape"),
}


@pytest.mark.parametrize("case", list(WEIGHT_EDITS))
def test_weights_that_do_not_fit(saved, tmp_path, fresh_workspace, case):
    change, match = WEIGHT_EDITS[case]
    failed_load(weights_edit(saved, tmp_path / f"{case}.keras", change), match, fresh_workspace)


def test_not_a_model_file(tmp_path, fresh_workspace):
    bad = tmp_path / "junk.keras"
    bad.write_bytes(b"\x00\x01garbage" * 30)
    failed_load(bad, "not an HDF5 file", fresh_workspace)
    with pytest.raises(KerasConfigError, match="is a directory"):
        keras.load_model(tmp_path)
    with pytest.raises(FileNotFoundError):
        keras.load_model(tmp_path / "missing.keras")


# ----------------------------------------------------------------------------- legacy .h5

@pytest.fixture
def legacy(tmp_path):
    model = functional()
    model.save(tmp_path / "ok.h5")
    return tmp_path / "ok.h5"


def h5_edit(src: Path, dst: Path, change: Callable[[Any], None]) -> Path:
    dst.write_bytes(src.read_bytes())
    with h5py.File(dst, "a") as h5:
        change(h5)
    return dst


LEGACY_EDITS = {
    "no_model_config": (lambda h5: h5.attrs.__delitem__("model_config"), "no model config"),
    "model_config_int": (lambda h5: h5.attrs.__setitem__("model_config", 7), "JSON text"),
    "model_config_deep": (lambda h5: h5.attrs.__setitem__("model_config", "[" * 300 + "]" * 300), "nested 300"),
    "model_config_units": (lambda h5: h5.attrs.__setitem__("model_config", h5.attrs["model_config"].replace(
        '"units": 2', '"units": 1000000000000')), "limit"),
    "weight_names_int": (lambda h5: h5["model_weights/head"].attrs.__setitem__("weight_names", 3), "weight_names"),
    "weight_name_missing": (lambda h5: h5["model_weights/head"].attrs.__setitem__(
        "weight_names", [b"head/head/kernel", b"head/nothing"]), "head/nothing"),
    "weight_dtype_complex": (lambda h5: replace_dataset(h5, "model_weights/head/head/head/bias",
                                                        np.zeros(2, np.complex64)), "dtype"),
    "weight_shape": (lambda h5: replace_dataset(h5, "model_weights/conv/conv/conv/kernel", np.zeros(4, np.float32)),
                     "conv"),
    "training_config_bad": (lambda h5: h5.attrs.__setitem__("training_config", "{not json"), "training_config"),
}


@pytest.mark.parametrize("case", list(LEGACY_EDITS))
def test_legacy_h5(legacy, tmp_path, fresh_workspace, case):
    change, match = LEGACY_EDITS[case]
    failed_load(h5_edit(legacy, tmp_path / f"{case}.h5", change), match, fresh_workspace)


@pytest.mark.parametrize("cut", [100, 1000, 5000])
def test_truncated_legacy_h5(legacy, tmp_path, fresh_workspace, cut):
    bad = tmp_path / f"cut{cut}.h5"
    bad.write_bytes(legacy.read_bytes()[:cut])
    err = failed_load(bad, "cut", fresh_workspace)
    assert err.__cause__ is not None or "signature" in str(err)


def test_hdf5_read_past_its_time_is_an_error_not_a_hang(legacy, fresh_workspace, monkeypatch):
    """A read libhdf5 never finishes is cut off by the worker's timeout (here made tiny to force it)."""
    import cgvm.guard

    monkeypatch.setenv("CGVM_READ_TIMEOUT", "0.000001")
    # the deadline also grants size / rate, which for this small file is about a millisecond: time
    # enough for a worker already running to answer, so the rate is made endless here
    monkeypatch.setattr(cgvm.guard, "_BYTES_PER_SECOND", float("inf"))
    failed_load(legacy, "gave no answer", fresh_workspace)
    monkeypatch.setenv("CGVM_READ_TIMEOUT", "soon")
    with pytest.raises(KerasConfigError, match="CGVM_READ_TIMEOUT"):
        keras.load_model(legacy)
    monkeypatch.delenv("CGVM_READ_TIMEOUT")
    assert keras.load_model(legacy).name == "corpus_func"  # a new worker after the killed one


def test_without_a_worker_process_files_are_read_in_process(legacy, tmp_path, fresh_workspace, monkeypatch):
    """Where no subprocess can be started, the same checks run in-process (without the hang guard)."""
    import cgvm.frontends.keras.h5_guard as guard

    monkeypatch.setattr(guard, "_get_worker", lambda: None)
    assert keras.load_model(legacy).name == "corpus_func"
    bad = tmp_path / "cut.h5"
    bad.write_bytes(legacy.read_bytes()[:4000])
    err = failed_load(bad, "cannot be read", fresh_workspace)
    assert isinstance(err.__cause__, OSError)


# ----------------------------------------------------------------------------- load_weights

@pytest.mark.parametrize("fmt", [".weights.h5", ".h5"])
def test_load_weights_is_all_or_nothing(tmp_path, fmt):
    """The last weight of the file is bad (dtype strings / shape): none of the earlier ones is assigned."""
    source = sequential()
    path = tmp_path / f"w{fmt}"
    source.save_weights(path) if fmt == ".weights.h5" else source.save(path)
    last = "layers/dense_1/vars/1" if fmt == ".weights.h5" else "model_weights/d2/d2/d2/bias"
    for i, bad_value in enumerate([np.array([b"x", b"y"]), np.zeros(5, np.float32), np.zeros(2, np.complex128)]):
        target = sequential()
        before = fingerprint(target)
        bad = h5_edit(path, tmp_path / f"bad{i}{fmt}", lambda h5: replace_dataset(h5, last, bad_value))
        with pytest.raises(KerasConfigError, match=bad.name):
            target.load_weights(bad)
        assert same(fingerprint(target), before), "load_weights changed the model, then failed"
    target = sequential()
    target.load_weights(path)
    assert same([(None, w) for w in target.get_weights()], [(None, w) for w in source.get_weights()])


def test_load_weights_from_corrupt_files(tmp_path):
    source = sequential()
    path = tmp_path / "w.weights.h5"
    source.save_weights(path)
    data = path.read_bytes()
    target = sequential()
    before = fingerprint(target)
    for i, bad_bytes in enumerate([data[:len(data) // 3], data[:600] + bytes(2000) + data[2600:], b"\x89HDF\r\n\x1a\n"]):
        bad = tmp_path / f"c{i}.weights.h5"
        bad.write_bytes(bad_bytes)
        with pytest.raises(KerasConfigError, match=bad.name):
            target.load_weights(bad)
        assert same(fingerprint(target), before)
    with pytest.raises(KerasConfigError, match="directory"):
        target.load_weights(tmp_path)


# ----------------------------------------------------------------------------- model_from_json

def test_model_from_json_given_a_path(tmp_path, fresh_workspace):
    path = tmp_path / "model.json"
    path.write_text(sequential().to_json())
    for given in (str(path), path):
        with pytest.raises(KerasConfigError, match="not a file name"):
            keras.model_from_json(given)
    assert keras.model_from_json(path.read_text()).name == "corpus_seq"


@pytest.mark.parametrize("text,match", [
    ("{", "not valid JSON"),
    ("[" * 1000 + "]" * 1000, "nested 1000 deep"),
    (b"\xff\xfe", "not UTF-8"),
    ('{"class_name": "Functional", "config": {"layers": [], "input_layers": "abc", "output_layers": "abc"}}',
     "input_layers"),
    ('{"class_name": "Sequential", "config": {"layers": [{"class_name": "Dense", "config": {"units": 4}}]},'
     ' "build_config": {"input_shape": [null, 10000000000000]}}', "limit"),
    ('{"class_name": 3}', "class_name"),
    ("7", "model config"),
])
def test_model_from_json_malformed(fresh_workspace, text, match):
    with pytest.raises(KerasConfigError, match=match):
        keras.model_from_json(text)
    assert not len(fresh_workspace)


# ----------------------------------------------------------------------------- safe_mode

def test_safe_mode_is_explicit(tmp_path, fresh_workspace):
    model = keras.Sequential([keras.Input((3,)), L.Lambda(lambda t: t * 2.0), L.Dense(1)])
    path = tmp_path / "lam.keras"
    model.save(path)
    for value in (True, None):
        failed_load(path, "safe_mode=False", fresh_workspace, safe_mode=value)
    for value in ("False", "false", 0, "", [], "no"):  # only a real False lets the file's code run
        with pytest.raises(KerasConfigError, match="safe_mode must be True or False"):
            keras.load_model(path, safe_mode=value)
    assert keras.load_model(path, safe_mode=False).predict(np.ones((1, 3), np.float32), verbose=0).shape == (1, 1)


def test_every_failure_is_a_cgvm_error(saved, tmp_path):
    """KerasConfigError is what callers catch as cgvm's error (and as ValueError, as Keras raises)."""
    bad = tmp_path / "x.keras"
    bad.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    with pytest.raises(CgvmError):
        keras.load_model(bad)
