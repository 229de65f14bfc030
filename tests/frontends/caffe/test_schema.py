"""proto/caffe.proto against BVLC Caffe's schema, and caffe_pb2.py against proto/caffe.proto."""
from __future__ import annotations

import ast
import importlib.util
import re
import struct
from pathlib import Path

import pytest
from google.protobuf import descriptor as _descriptor

from cgvm.frontends.caffe import caffe_pb2
from shared_paths import SHARED

REPO_ROOT = Path(__file__).resolve().parents[3]
FACTS = SHARED / "reference" / "caffe_facts.md"
GENERATED = REPO_ROOT / "cgvm" / "frontends" / "caffe" / "caffe_pb2.py"

FD = _descriptor.FieldDescriptor
_SCALAR_TYPE_NAMES = {
    FD.TYPE_DOUBLE: "double", FD.TYPE_FLOAT: "float", FD.TYPE_INT64: "int64",
    FD.TYPE_UINT64: "uint64", FD.TYPE_INT32: "int32", FD.TYPE_UINT32: "uint32",
    FD.TYPE_BOOL: "bool", FD.TYPE_STRING: "string", FD.TYPE_BYTES: "bytes",
}


def _is_repeated(field: _descriptor.FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)
    return bool(flag) if flag is not None else field.label == FD.LABEL_REPEATED


def _is_required(field: _descriptor.FieldDescriptor) -> bool:
    flag = getattr(field, "is_required", None)
    return bool(flag) if flag is not None else field.label == FD.LABEL_REQUIRED


def _label(field: _descriptor.FieldDescriptor) -> str:
    return "rep" if _is_repeated(field) else "req" if _is_required(field) else "opt"


def _type_name(field: _descriptor.FieldDescriptor) -> str:
    if field.message_type is not None:
        return field.message_type.name
    if field.enum_type is not None:
        return f"enum {field.enum_type.name}"
    name = _SCALAR_TYPE_NAMES[field.type]
    packed = field.GetOptions().packed if field.GetOptions().HasField("packed") else False
    return f"{name} packed" if packed else name


def _facts_tables() -> dict[str, dict]:
    """Appendix A of caffe_facts.md: message -> {"fields": {name: row}, "enums": {name: values}}."""
    text = FACTS.read_text(encoding="utf-8")
    appendix = text[text.index("## Appendix A"):]
    messages: dict[str, dict] = {}
    current = None
    for line in appendix.splitlines():
        heading = re.match(r"### (\w+)$", line)
        if heading:
            current = messages.setdefault(heading.group(1), {"fields": {}, "enums": {}})
            continue
        if current is None:
            continue
        enum = re.match(r"- enum (\w+): (.*)$", line)
        if enum:
            values = dict(item.split("=") for item in enum.group(2).split(", "))
            current["enums"][enum.group(1)] = {k: int(v) for k, v in values.items()}
            continue
        row = re.match(r"\| (\w+) \| (\d+) \| (\w+) \| ([\w ]+?) \| (.*?) \|$", line)
        if row and row.group(1) != "field":
            name, number, label, type_name, default = row.groups()
            current["fields"][name] = (int(number), label, type_name, default)
    return messages


def _check_default(field: _descriptor.FieldDescriptor, written: str) -> None:
    if written == "—":
        assert _is_repeated(field) or field.message_type is not None, field.full_name
        return
    implicit = written.startswith("(") and written.endswith(")")
    assert field.has_default_value is not implicit, f"{field.full_name}: default {written}"
    if implicit:
        return
    value = field.default_value
    if field.enum_type is not None:
        assert field.enum_type.values_by_number[value].name == written, field.full_name
    elif field.type == FD.TYPE_BOOL:
        assert value is (written == "true"), field.full_name
    elif field.type == FD.TYPE_STRING:
        assert value == written.strip("'"), field.full_name
    elif field.type == FD.TYPE_FLOAT:
        as_float32 = struct.unpack("<f", struct.pack("<f", float(written)))[0]
        assert value == pytest.approx(as_float32, rel=1e-7), field.full_name
    else:
        assert value == int(written), field.full_name


@pytest.mark.skipif(not FACTS.exists(), reason="shared/reference/caffe_facts.md not present")
def test_every_message_field_and_enum_matches_bvlc_tables():
    tables = _facts_tables()
    assert len(tables) >= 60  # sanity: the appendix was found and read
    declared = set(caffe_pb2.DESCRIPTOR.message_types_by_name) - set(FORK_MESSAGES)
    assert declared == set(tables), f"missing: {set(tables) - declared}, extra: {declared - set(tables)}"
    for message_name, table in tables.items():
        message = caffe_pb2.DESCRIPTOR.message_types_by_name[message_name]
        fields = set(message.fields_by_name) - set(FORK_FIELDS.get(message_name, {}))
        assert fields == set(table["fields"]), message_name
        for field_name, (number, label, type_name, default) in table["fields"].items():
            field = message.fields_by_name[field_name]
            assert field.number == number, field.full_name
            assert _label(field) == label, field.full_name
            assert _type_name(field) == type_name, field.full_name
            _check_default(field, default)
        assert set(message.enum_types_by_name) == set(table["enums"]), message_name
        for enum_name, values in table["enums"].items():
            enum = message.enum_types_by_name[enum_name]
            assert {v.name: v.number for v in enum.values} == values, enum.full_name


# the forks' additions cgvm reads (docs/caffe_forks.md): field numbers as in weiliu89/caffe's ssd branch;
# ceil_mode moved off the forks' 13, which BVLC gave round_mode
FORK_MESSAGES = ("PermuteParameter", "NormalizeParameter", "PriorBoxParameter", "DetectionOutputParameter",
                 "NonMaximumSuppressionParameter", "SaveOutputParameter", "ResizeParameter")
FORK_FIELDS = {"LayerParameter": {"permute_param": 202, "prior_box_param": 203, "detection_output_param": 204,
                                  "norm_param": 206},
               "PoolingParameter": {"ceil_mode": 1013}}


def test_fork_additions_are_numbered_as_in_the_forks():
    for message_name, fields in FORK_FIELDS.items():
        descriptor = caffe_pb2.DESCRIPTOR.message_types_by_name[message_name]
        for name, number in fields.items():
            assert descriptor.fields_by_name[name].number == number, name
    prior = caffe_pb2.PriorBoxParameter.DESCRIPTOR.fields_by_name
    assert (prior["min_size"].number, prior["offset"].number, prior["step_w"].number) == (1, 13, 12)
    out = caffe_pb2.DetectionOutputParameter.DESCRIPTOR.fields_by_name
    assert (out["keep_top_k"].number, out["variance_encoded_in_target"].number, out["save_file"].number) == (7, 8, 12)
    assert caffe_pb2.PriorBoxParameter.CodeType.Value("CENTER_SIZE") == 2
    assert caffe_pb2.NormalizeParameter().eps == pytest.approx(1e-10)
    assert caffe_pb2.PoolingParameter().ceil_mode is True


def test_key_numbers_and_defaults_without_the_facts_file():
    net = caffe_pb2.NetParameter.DESCRIPTOR.fields_by_name
    assert (net["layer"].number, net["layers"].number, net["input_dim"].number) == (100, 2, 4)
    layer = caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name
    assert layer["convolution_param"].number == 106
    assert layer["clip_param"].number == 148
    v1 = caffe_pb2.V1LayerParameter.DESCRIPTOR.fields_by_name
    assert (v1["param"].number, v1["blob_share_mode"].number, v1["layer"].number) == (1001, 1002, 1)
    assert caffe_pb2.BlobShape.DESCRIPTOR.fields_by_name["dim"].GetOptions().packed
    assert caffe_pb2.Phase.Value("TRAIN") == 0 and caffe_pb2.Phase.Value("TEST") == 1
    solver = caffe_pb2.SolverParameter()
    assert (solver.type, solver.solver_mode, solver.random_seed) == ("SGD", solver.GPU, -1)
    assert (solver.snapshot_format, solver.average_loss) == (solver.BINARYPROTO, 1)
    assert caffe_pb2.NetState().phase == caffe_pb2.TEST
    assert caffe_pb2.FillerParameter().type == "constant"
    assert caffe_pb2.LossParameter().normalization == caffe_pb2.LossParameter.VALID
    assert caffe_pb2.PoolingParameter().round_mode == caffe_pb2.PoolingParameter.CEIL
    assert caffe_pb2.V1LayerParameter().type == caffe_pb2.V1LayerParameter.NONE


def _serialized_descriptor(source: str) -> bytes:
    """The FileDescriptorProto bytes a generated _pb2 module registers."""
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "AddSerializedFile"):
            return ast.literal_eval(node.args[0])
    raise AssertionError("no AddSerializedFile call in the generated module")


def test_checked_in_module_matches_a_fresh_generation():
    pytest.importorskip("grpc_tools")
    spec = importlib.util.spec_from_file_location("gen_proto", REPO_ROOT / "scripts" / "gen_proto.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    fresh = generator.generate_source("caffe")
    checked_in = GENERATED.read_text(encoding="utf-8")
    assert _serialized_descriptor(fresh) == _serialized_descriptor(checked_in), (
        "caffe_pb2.py is stale: run python scripts/gen_proto.py caffe")
    if generator.protoc_version() in checked_in:  # same protoc: the whole text must agree
        assert fresh == checked_in


def test_checked_in_module_has_no_runtime_version_gate():
    source = GENERATED.read_text(encoding="utf-8")
    assert "ValidateProtobufRuntimeVersion" not in source
    assert "libprotoc" in source.splitlines()[2]  # the header names the protoc that made it
