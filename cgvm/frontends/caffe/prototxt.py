"""Read and write Caffe files as messages of cgvm's caffe.proto (BVLC field numbers).

Text (`.prototxt` nets and solvers) is parsed strictly, as Caffe does: an unknown field is an
error that names it, and says so when it comes from a known Caffe fork. Binary files
(`.caffemodel`, `.binaryproto`, `.solverstate`) are checked whole before anything is returned, so a
truncated or corrupt file raises `CaffeParseError` instead of loading in part. Reading a net runs
the legacy upgrades of `upgrade.py` unless `upgrade=False`.
"""
from __future__ import annotations

import difflib
import math
import os
import re
import secrets
from pathlib import Path
from typing import TypeVar, Union

from google.protobuf import message as _message
from google.protobuf import text_format

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeParseError
from cgvm.frontends.caffe.upgrade import upgrade_net, upgrade_snapshot_prefix, upgrade_solver

PathLike = Union[str, "os.PathLike[str]"]
BinarySource = Union[str, "os.PathLike[str]", bytes]
MessageT = TypeVar("MessageT", bound=_message.Message)

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"

# Fields and layer types that BVLC Caffe does not have but well-known forks do. A file that uses
# them fails a strict BVLC parse; the error then says where the name comes from.
_SSD = "the SSD fork (weiliu89/caffe)"
_FRCNN = "the Fast/Faster R-CNN fork (rbgirshick/caffe-fast-rcnn)"
_DEEPLAB = "the DeepLab / PSPNet forks"
_YOLO = "YOLO forks of Caffe"
FORK_FIELDS: dict[str, str] = {
    "permute_param": f"{_SSD}, Permute layer",
    "prior_box_param": f"{_SSD}, PriorBox layer",
    "detection_output_param": f"{_SSD}, DetectionOutput layer",
    "detection_evaluate_param": f"{_SSD}, DetectionEvaluate layer",
    "multibox_loss_param": f"{_SSD}, MultiBoxLoss layer",
    "normalize_param": f"{_SSD}, Normalize layer",
    "annotated_data_param": f"{_SSD}, AnnotatedData layer",
    "video_data_param": f"{_SSD}, VideoData layer",
    "resize_param": f"{_SSD}, data augmentation",
    "noise_param": f"{_SSD}, data augmentation",
    "distort_param": f"{_SSD}, data augmentation",
    "expand_param": f"{_SSD}, data augmentation",
    "emit_constraint": f"{_SSD}, data augmentation",
    "eval_type": f"{_SSD}, detection evaluation in the solver",
    "ap_version": f"{_SSD}, detection evaluation in the solver",
    "show_per_class_result": f"{_SSD}, detection evaluation in the solver",
    "roi_pooling_param": f"{_FRCNN}, ROIPooling layer",
    "smooth_l1_loss_param": f"{_FRCNN}, SmoothL1Loss layer",
    "scale_train": f"{_FRCNN}, non-inverted Dropout (BVLC Dropout always rescales in TRAIN)",
    "proposal_param": "Faster R-CNN derived forks, Proposal layer",
    "psroi_pooling_param": "the R-FCN fork (daijifeng001/caffe-rfcn), PSROIPooling layer",
    "interp_param": f"{_DEEPLAB}, Interp (bilinear resize) layer",
    "seg_accuracy_param": f"{_DEEPLAB}, SegAccuracy layer",
    "mat_read_param": f"{_DEEPLAB}, MatRead layer",
    "bn_param": "the 'BN' layer of SegNet / PSPNet and other forks (BVLC: BatchNorm + Scale)",
    "batch_renorm_param": "Batch Renormalization forks, BatchReNorm layer",
    "upsample_param": "SegNet / YOLOv3 forks, Upsample layer",
    "reorg_param": f"{_YOLO}, Reorg layer",
    "region_param": f"{_YOLO}, Region layer",
    "yolo_param": f"{_YOLO}, Yolo layer",
    "eval_detection_param": f"{_YOLO}, EvalDetection layer",
    "shuffle_channel_param": "ShuffleNet forks, ShuffleChannel layer",
    "center_loss_param": "the center-loss fork (ydwen/caffe-face), CenterLoss layer",
    "margin_inner_product_param": "the L-Softmax / SphereFace forks, MarginInnerProduct layer",
    "ceil_mode": "DenseNet-Caffe and similar forks (BVLC: `round_mode: FLOOR` for ceil_mode: false)",
}
FORK_LAYER_TYPES: dict[str, str] = {
    "Permute": _SSD, "PriorBox": _SSD, "DetectionOutput": _SSD, "DetectionEvaluate": _SSD,
    "MultiBoxLoss": _SSD, "Normalize": _SSD, "AnnotatedData": _SSD, "VideoData": _SSD,
    "ROIPooling": _FRCNN, "SmoothL1Loss": _FRCNN, "Proposal": "Faster R-CNN derived forks",
    "PSROIPooling": "the R-FCN fork", "Interp": _DEEPLAB, "SegAccuracy": _DEEPLAB,
    "BN": "SegNet / PSPNet forks", "BatchReNorm": "Batch Renormalization forks",
    "Upsample": "SegNet / YOLOv3 forks", "Reorg": _YOLO, "Region": _YOLO, "Yolo": _YOLO,
    "EvalDetection": _YOLO, "ShuffleChannel": "ShuffleNet forks",
    "ConvolutionDepthwise": "MobileNet forks", "DepthwiseConvolution": "MobileNet forks",
    "CenterLoss": "the center-loss fork", "MarginInnerProduct": "the L-Softmax / SphereFace forks",
    "Axpy": "SENet forks", "ReLU6": "MobileNet-v2 forks",
}
# V1 (`layers {}`) spellings written inside a current `layer {}` block.
_V1_ONLY_FIELDS = {
    "blobs_lr": "in `layer { }` write `param { lr_mult: ... }` (blobs_lr is the V1 `layers` format)",
    "weight_decay": "in `layer { }` write `param { decay_mult: ... }` (weight_decay is V1)",
    "blob_share_mode": "in `layer { }` write `param { share_mode: ... }` (blob_share_mode is V1)",
}


def describe_fork_extension(name: str) -> str | None:
    """Where a non-BVLC field name or layer type comes from, or None if it is not a known one."""
    return FORK_FIELDS.get(name) or FORK_LAYER_TYPES.get(name)


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------

def parse_net_text(text: str, filename: str = "<string>") -> caffe_pb2.NetParameter:
    """Parse prototxt text into a NetParameter, strictly and without upgrading it."""
    return _parse_text(text, caffe_pb2.NetParameter(), filename)


def parse_solver_text(text: str, filename: str = "<string>") -> caffe_pb2.SolverParameter:
    """Parse solver prototxt text into a SolverParameter, strictly and without upgrading it."""
    return _parse_text(text, caffe_pb2.SolverParameter(), filename)


def read_net(
    path_or_text: PathLike, *, filename: str | None = None, upgrade: bool = True
) -> caffe_pb2.NetParameter:
    """Read a net from a .prototxt path or from prototxt text, upgraded to the current format.

    A `str` is taken as text when it holds a newline, `{` or `:` and names no existing file;
    `filename` names text in error messages. `upgrade=False` returns the net as written.
    """
    text, name = _text_source(path_or_text, filename)
    net = parse_net_text(text, name)
    return upgrade_net(net, source=name) if upgrade else net


def read_solver(path: PathLike, *, upgrade: bool = True) -> caffe_pb2.SolverParameter:
    """Read a solver .prototxt; with `upgrade`, apply Caffe's solver upgrades.

    Those are `solver_type` -> `type` and the snapshot_prefix rule (unset: the solver path without
    its extension; an existing directory: that directory / the solver file's stem).
    """
    text = _read_text_file(path)
    name = os.fspath(path)
    solver = parse_solver_text(text, name)
    if upgrade:
        solver = upgrade_snapshot_prefix(upgrade_solver(solver, source=name), name)
    return solver


def read_net_with_lines(
    path_or_text: PathLike, *, filename: str | None = None
) -> tuple[caffe_pb2.NetParameter, list[int | None]]:
    """Like `read_net` (upgraded), plus the 1-based source line of each resulting layer.

    Converters quote these in errors. A layer the upgrade made up (the Input layer built from
    net-level `input` fields) gets the line of the first `input` field; None where unknown.
    """
    text, name = _text_source(path_or_text, filename)
    raw = parse_net_text(text, name)
    net = upgrade_net(raw, source=name)
    return net, _upgraded_layer_lines(text, raw, len(net.layer))


def _top_level_fields(text: str) -> list[tuple[str, int]]:
    """(field name, line) of every field written at the top level of a prototxt text."""
    fields, depth, line, after_colon = [], 0, 1, False
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in "{<[":
            depth, after_colon = depth + 1, False
        elif token in "}>]":
            depth -= 1
        elif token == ":":
            after_colon = True
        elif not token.isspace() and not token.startswith("#") and token != ",":
            if depth == 0 and not after_colon and _IDENTIFIER.fullmatch(token):
                fields.append((token, line))
            after_colon = False
        line += token.count("\n")
    return fields


_TOKEN = re.compile(r"""\s+|\#[^\n]*|"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|[\w.+-]+|.""")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def _upgraded_layer_lines(text: str, raw: caffe_pb2.NetParameter, count: int) -> list[int | None]:
    fields = _top_level_fields(text)
    if raw.layers:  # V1 or V0: one `layers` entry per layer, minus V0 padding layers
        v1_lines = [line for name, line in fields if name == "layers"]
        lines: list[int | None] = [
            line for line, entry in zip(v1_lines, raw.layers)
            if not (entry.HasField("layer") and entry.layer.type == "padding")]
    else:
        lines = [line for name, line in fields if name == "layer"]
    if raw.input and (raw.input_shape or raw.input_dim):
        lines.insert(0, next((line for name, line in fields if name == "input"), None))
    return lines if len(lines) == count else [None] * count


def net_to_text(net: _message.Message) -> str:
    """Protobuf text format of a message (a NetParameter, usually), as Caffe writes prototxt."""
    return text_format.MessageToString(net)


def write_net_text(net: _message.Message, path: PathLike) -> None:
    """Write `net_to_text(net)` to `path` (replaced atomically)."""
    _write_atomically(path, net_to_text(net).encode("utf-8"))


def _text_source(path_or_text: PathLike, filename: str | None) -> tuple[str, str]:
    if isinstance(path_or_text, os.PathLike):
        return _read_text_file(path_or_text), filename or os.fspath(path_or_text)
    if not isinstance(path_or_text, str):
        raise TypeError(f"expected a path or prototxt text, got {type(path_or_text).__name__}")
    looks_like_text = any(mark in path_or_text for mark in ("\n", "{", ":")) or not path_or_text
    if looks_like_text and not (len(path_or_text) < 4096 and os.path.isfile(path_or_text)):
        return path_or_text, filename or "<string>"
    return _read_text_file(path_or_text), filename or path_or_text


def _read_text_file(path: PathLike) -> str:
    name = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"Caffe file not found: {name}") from None
    except OSError as exc:   # a directory, no permission
        raise CaffeParseError(f"cannot read the file: {exc.strerror or exc}", filename=name) from exc
    if data.startswith(HDF5_SIGNATURE) or b"\x00" in data[:4096]:
        raise CaffeParseError("this is a binary file, not prototxt text", filename=name,
                              hint="Binary weights (.caffemodel) are read with read_net_binary.")
    try:
        return data.decode("utf-8-sig")  # tolerate a byte-order mark from Windows editors
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise CaffeParseError(
            f"byte 0x{data[exc.start]:02x} is not UTF-8 text", filename=name, line=line,
            column=column, hint="Prototxt files are UTF-8 text; binary files use read_net_binary.",
        ) from exc


def _parse_text(text: str, message: MessageT, filename: str) -> MessageT:
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise _text_error(exc, text, filename) from exc
    _check_required_fields(message, filename)
    return message


_LOCATION_PREFIX = re.compile(r"^\d+:\d+ : ")
_UNKNOWN_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')
_UNKNOWN_ENUM = re.compile(r'Enum type "([\w.]+)" has no value named (\w+)')
_BARE_STRING = re.compile(r"Expected string but found: '(\w+)'")


def _text_error(exc: text_format.ParseError, text: str, filename: str) -> CaffeParseError:
    line, column = exc.GetLine(), exc.GetColumn()
    message = _LOCATION_PREFIX.sub("", str(exc), count=1)
    lines = text.split("\n")  # protobuf counts lines the same way
    source_line = lines[line - 1].rstrip("\r") if line and 0 < line <= len(lines) else None
    if source_line is not None:
        quoted = f"'{source_line}': "
        if message.startswith(quoted):
            message = message[len(quoted):]
    message, hint = _explain(message.rstrip("."))
    if line and message.startswith('Expected "}"') and _only_blank_after(lines, line):
        message, hint = "the text ends inside a { } block", "add the missing closing brace"
    return CaffeParseError(message, filename=filename, line=line, column=column,
                           source_line=source_line, hint=hint)


def _only_blank_after(lines: list[str], line: int) -> bool:
    return all(not rest.strip() or rest.lstrip().startswith("#") for rest in lines[line:])


def _explain(message: str) -> tuple[str, str | None]:
    """Rewrite protobuf's wording into Caffe terms and find a hint for the user."""
    unknown_field = _UNKNOWN_FIELD.search(message)
    if unknown_field:
        type_name, field = unknown_field.groups()
        message = f'unknown field "{field}" in {type_name}'
        fork = FORK_FIELDS.get(field)
        if fork:
            return message, (f'"{field}" is not BVLC Caffe: it comes from {fork}. cgvm reads '
                             "BVLC Caffe's schema; rewrite the net with BVLC layers.")
        if field in _V1_ONLY_FIELDS and type_name == "caffe.LayerParameter":
            return message, _V1_ONLY_FIELDS[field]
        known = caffe_pb2.DESCRIPTOR.pool.FindMessageTypeByName(type_name).fields_by_name
        close = difflib.get_close_matches(field, list(known), n=1)
        hint = f'did you mean "{close[0]}"?' if close else f"{type_name} has no such field in BVLC Caffe."
        return message, hint
    unknown_enum = _UNKNOWN_ENUM.search(message)
    if unknown_enum:
        enum_name, value = unknown_enum.groups()
        values = caffe_pb2.DESCRIPTOR.pool.FindEnumTypeByName(enum_name).values_by_name
        hint = f"valid values: {', '.join(values)}"
        if enum_name == "caffe.V1LayerParameter.LayerType":
            hint += ' (the current format is `layer { type: "Name" }`)'
        return f"unknown value {value} for {enum_name}", hint
    bare = _BARE_STRING.search(message)
    if bare:
        return message, f'string values are quoted: write "{bare.group(1)}"'
    if message.startswith('Expected "}"') or "got }" in message:
        return message, "braces do not balance; check the block that ends here"
    return message, None


def _check_required_fields(message: _message.Message, filename: str) -> None:
    if message.IsInitialized():
        return
    missing = message.FindInitializationErrors()
    described = []
    for path in missing:
        layer_index = re.match(r"layer\[(\d+)\]", path)
        if layer_index and isinstance(message, caffe_pb2.NetParameter):
            described.append(f'{path} (layer "{message.layer[int(layer_index.group(1))].name}")')
        else:
            described.append(path)
    raise CaffeParseError(f"missing required field(s): {', '.join(described)}", filename=filename)


# --------------------------------------------------------------------------------------------
# Binary
# --------------------------------------------------------------------------------------------

def read_net_binary(source: BinarySource, *, upgrade: bool = True) -> caffe_pb2.NetParameter:
    """Read a binary NetParameter (.caffemodel) from a path or bytes, upgraded unless asked not to.

    Every blob's data must match its shape; otherwise the file is reported truncated or corrupt.
    """
    data, name = _binary_source(source)
    net = _parse_binary(data, caffe_pb2.NetParameter(), name, "a binary NetParameter (.caffemodel)")
    for where, blob in _net_blobs(net):
        check_blobproto(blob, where=where, filename=name)
    return upgrade_net(net, source=name) if upgrade else net


def read_blobproto(source: BinarySource) -> caffe_pb2.BlobProto:
    """Read a single binary BlobProto (.binaryproto, e.g. a mean image) from a path or bytes."""
    data, name = _binary_source(source)
    blob = _parse_binary(data, caffe_pb2.BlobProto(), name, "a binary BlobProto (.binaryproto)")
    check_blobproto(blob, where="blob", filename=name)
    return blob


def read_solver_state(source: BinarySource) -> caffe_pb2.SolverState:
    """Read a binary SolverState (.solverstate) from a path or bytes."""
    data, name = _binary_source(source)
    state = _parse_binary(data, caffe_pb2.SolverState(), name, "a binary SolverState")
    for index, blob in enumerate(state.history):
        check_blobproto(blob, where=f"history[{index}]", filename=name)
    return state


def write_net_binary(net: caffe_pb2.NetParameter, path: PathLike) -> None:
    """Write a NetParameter as a binary .caffemodel (replaced atomically)."""
    _write_atomically(path, _serialize(net, os.fspath(path)))


def write_blobproto(blob: caffe_pb2.BlobProto, path: PathLike) -> None:
    """Write a BlobProto as a binary .binaryproto (replaced atomically)."""
    _write_atomically(path, _serialize(blob, os.fspath(path)))


def write_solver_state(state: caffe_pb2.SolverState, path: PathLike) -> None:
    """Write a SolverState as a binary .solverstate (replaced atomically)."""
    _write_atomically(path, _serialize(state, os.fspath(path)))


def blobproto_shape(blob: caffe_pb2.BlobProto) -> tuple[int, ...]:
    """The shape Caffe gives a stored blob: the legacy (num, channels, height, width) when any of
    those four is set, else `shape.dim` (no dims: a scalar)."""
    if any(blob.HasField(f) for f in ("num", "channels", "height", "width")):
        return (blob.num, blob.channels, blob.height, blob.width)
    return tuple(blob.shape.dim)


def check_blobproto(blob: caffe_pb2.BlobProto, *, where: str, filename: str) -> None:
    """Raise CaffeParseError unless the blob's data (and diff, if any) hold exactly shape-many values."""
    shape = blobproto_shape(blob)
    if any(dim < 0 for dim in shape):
        raise CaffeParseError(f"{where}: negative dimension in shape {shape}", filename=filename)
    count = math.prod(shape)
    for label, single, double in (("data", blob.data, blob.double_data),
                                  ("diff", blob.diff, blob.double_diff)):
        stored = len(double) if len(double) else len(single)
        if label == "diff" and stored == 0:
            continue  # diffs are optional
        if stored != count:
            raise CaffeParseError(
                f"{where}: shape {shape} needs {count} {label} values, the file holds {stored}",
                filename=filename, hint="The file is truncated or corrupt, or was not written by Caffe.",
            )


def _net_blobs(net: caffe_pb2.NetParameter):
    for index, layer in enumerate(net.layer):
        for b, blob in enumerate(layer.blobs):
            yield f'layer[{index}] "{layer.name}" blob {b}', blob
    for index, layer in enumerate(net.layers):
        name = layer.name or layer.layer.name
        for b, blob in enumerate(list(layer.blobs) + list(layer.layer.blobs)):
            yield f'layers[{index}] "{name}" blob {b}', blob


def _binary_source(source: BinarySource) -> tuple[bytes, str]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), "<bytes>"
    name = os.fspath(source)
    try:
        return Path(source).read_bytes(), name
    except FileNotFoundError:
        raise FileNotFoundError(f"Caffe file not found: {name}") from None
    except OSError as exc:   # a directory, no permission
        raise CaffeParseError(f"cannot read the file: {exc.strerror or exc}", filename=name) from exc


def _looks_like_text(data: bytes) -> bool:
    head = data[:4096]
    try:
        decoded = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(ch.isprintable() or ch in "\t\r\n" for ch in decoded) and any(c in decoded for c in "{:")


def _parse_binary(data: bytes, message: MessageT, filename: str, what: str) -> MessageT:
    if not data:
        raise CaffeParseError(f"the file is empty; expected {what}", filename=filename)
    if data.startswith(HDF5_SIGNATURE):
        raise CaffeParseError(
            f"this is an HDF5 file; expected {what}", filename=filename,
            hint="HDF5 weights (.caffemodel.h5, .solverstate.h5) are read by the HDF5 loader.",
        )
    if _looks_like_text(data):
        raise CaffeParseError(
            f"this is a text file; expected {what}", filename=filename,
            hint="Prototxt text is read with read_net / read_solver.",
        )
    try:
        message.ParseFromString(data)
    except _message.DecodeError as exc:
        raise CaffeParseError(
            f"cannot decode {what} ({len(data)} bytes): {exc}", filename=filename,
            hint="The file is truncated or corrupt, or holds another kind of message.",
        ) from exc
    _check_required_fields(message, filename)
    return message


def _serialize(message: _message.Message, filename: str) -> bytes:
    _check_required_fields(message, filename)
    return message.SerializeToString()


def _write_atomically(path: PathLike, data: bytes) -> None:
    """Write to a new file beside `path`, then rename: readers never see half a file."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "xb") as stream:  # "x": never clobber; mode follows the umask
            stream.write(data)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
