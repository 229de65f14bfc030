"""Upgrade legacy Caffe definitions to the current format, as Caffe's util/upgrade_proto does.

Nets go through five steps, in Caffe's order, each only when needed: V0 -> V1 (nested
`layers { layer { ... } }`, padding layers folded into the next conv/pool), old data-transform
fields -> `transform_param`, V1 -> V2 (`layers { type: ENUM }` -> `layer { type: "Name" }`,
`blobs_lr` / `weight_decay` -> ParamSpec), net-level `input` + `input_dim` / `input_shape` -> an
`Input` layer, and BatchNorm's three declared params -> frozen. Solvers: `solver_type` -> `type`,
and the snapshot_prefix rule applied when a solver file is read.

Where Caffe aborts, we raise `CaffeUpgradeError`; where it logs an error and goes on, we warn with
`CaffeUpgradeWarning` and go on. Functions return upgraded copies; inputs are left untouched.
"""
from __future__ import annotations

import os
import warnings

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeUpgradeError, CaffeUpgradeWarning

_V1 = caffe_pb2.V1LayerParameter

# V1 LayerType enum value -> current type string.
V1_LAYER_TYPE_NAMES: dict[int, str] = {
    _V1.NONE: "", _V1.ABSVAL: "AbsVal", _V1.ACCURACY: "Accuracy", _V1.ARGMAX: "ArgMax",
    _V1.BNLL: "BNLL", _V1.CONCAT: "Concat", _V1.CONTRASTIVE_LOSS: "ContrastiveLoss",
    _V1.CONVOLUTION: "Convolution", _V1.DECONVOLUTION: "Deconvolution", _V1.DATA: "Data",
    _V1.DROPOUT: "Dropout", _V1.DUMMY_DATA: "DummyData", _V1.EUCLIDEAN_LOSS: "EuclideanLoss",
    _V1.ELTWISE: "Eltwise", _V1.EXP: "Exp", _V1.FLATTEN: "Flatten", _V1.HDF5_DATA: "HDF5Data",
    _V1.HDF5_OUTPUT: "HDF5Output", _V1.HINGE_LOSS: "HingeLoss", _V1.IM2COL: "Im2col",
    _V1.IMAGE_DATA: "ImageData", _V1.INFOGAIN_LOSS: "InfogainLoss",
    _V1.INNER_PRODUCT: "InnerProduct", _V1.LRN: "LRN", _V1.MEMORY_DATA: "MemoryData",
    _V1.MULTINOMIAL_LOGISTIC_LOSS: "MultinomialLogisticLoss", _V1.MVN: "MVN",
    _V1.POOLING: "Pooling", _V1.POWER: "Power", _V1.RELU: "ReLU", _V1.SIGMOID: "Sigmoid",
    _V1.SIGMOID_CROSS_ENTROPY_LOSS: "SigmoidCrossEntropyLoss", _V1.SILENCE: "Silence",
    _V1.SOFTMAX: "Softmax", _V1.SOFTMAX_LOSS: "SoftmaxWithLoss", _V1.SPLIT: "Split",
    _V1.SLICE: "Slice", _V1.TANH: "TanH", _V1.WINDOW_DATA: "WindowData",
    _V1.THRESHOLD: "Threshold",
}

# V0 type string -> V1 LayerType enum value ("padding" is folded away before this is used).
V0_LAYER_TYPES: dict[str, int] = {
    "accuracy": _V1.ACCURACY, "bnll": _V1.BNLL, "concat": _V1.CONCAT, "conv": _V1.CONVOLUTION,
    "data": _V1.DATA, "dropout": _V1.DROPOUT, "euclidean_loss": _V1.EUCLIDEAN_LOSS,
    "flatten": _V1.FLATTEN, "hdf5_data": _V1.HDF5_DATA, "hdf5_output": _V1.HDF5_OUTPUT,
    "im2col": _V1.IM2COL, "images": _V1.IMAGE_DATA, "infogain_loss": _V1.INFOGAIN_LOSS,
    "innerproduct": _V1.INNER_PRODUCT, "lrn": _V1.LRN,
    "multinomial_logistic_loss": _V1.MULTINOMIAL_LOGISTIC_LOSS, "pool": _V1.POOLING,
    "relu": _V1.RELU, "sigmoid": _V1.SIGMOID, "softmax": _V1.SOFTMAX,
    "softmax_loss": _V1.SOFTMAX_LOSS, "split": _V1.SPLIT, "tanh": _V1.TANH,
    "window_data": _V1.WINDOW_DATA,
}

# Per-type parameter messages a V1 layer carries over to the V2 layer unchanged.
_V1_COPIED_PARAMS = (
    "accuracy_param", "argmax_param", "concat_param", "contrastive_loss_param",
    "convolution_param", "data_param", "dropout_param", "dummy_data_param", "eltwise_param",
    "exp_param", "hdf5_data_param", "hdf5_output_param", "hinge_loss_param", "image_data_param",
    "infogain_loss_param", "inner_product_param", "lrn_param", "memory_data_param", "mvn_param",
    "pooling_param", "power_param", "relu_param", "sigmoid_param", "softmax_param", "slice_param",
    "tanh_param", "threshold_param", "window_data_param", "transform_param", "loss_param",
)

# V1 data layers whose own params once held the transform fields.
_DATA_LAYER_PARAMS = {_V1.DATA: "data_param", _V1.IMAGE_DATA: "image_data_param",
                      _V1.WINDOW_DATA: "window_data_param"}
_OLD_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")

# V0 flat fields: (V0 field, {V0 type: (param message, field in it)}). A field set on a layer type
# the table does not list is what Caffe calls "Unknown parameter ... for layer type".
_V0_FIELD_TARGETS: dict[str, dict[str, tuple[str, str]]] = {
    "num_output": {"conv": ("convolution_param", "num_output"),
                   "innerproduct": ("inner_product_param", "num_output")},
    "biasterm": {"conv": ("convolution_param", "bias_term"),
                 "innerproduct": ("inner_product_param", "bias_term")},
    "weight_filler": {"conv": ("convolution_param", "weight_filler"),
                      "innerproduct": ("inner_product_param", "weight_filler")},
    "bias_filler": {"conv": ("convolution_param", "bias_filler"),
                    "innerproduct": ("inner_product_param", "bias_filler")},
    "pad": {"conv": ("convolution_param", "pad"), "pool": ("pooling_param", "pad")},
    "kernelsize": {"conv": ("convolution_param", "kernel_size"),
                   "pool": ("pooling_param", "kernel_size")},
    "group": {"conv": ("convolution_param", "group")},
    "stride": {"conv": ("convolution_param", "stride"), "pool": ("pooling_param", "stride")},
    "pool": {"pool": ("pooling_param", "pool")},
    "dropout_ratio": {"dropout": ("dropout_param", "dropout_ratio")},
    "local_size": {"lrn": ("lrn_param", "local_size")},
    "alpha": {"lrn": ("lrn_param", "alpha")},
    "beta": {"lrn": ("lrn_param", "beta")},
    "k": {"lrn": ("lrn_param", "k")},
    "source": {"data": ("data_param", "source"), "hdf5_data": ("hdf5_data_param", "source"),
               "images": ("image_data_param", "source"),
               "window_data": ("window_data_param", "source"),
               "infogain_loss": ("infogain_loss_param", "source")},
    "batchsize": {"data": ("data_param", "batch_size"),
                  "hdf5_data": ("hdf5_data_param", "batch_size"),
                  "images": ("image_data_param", "batch_size"),
                  "window_data": ("window_data_param", "batch_size")},
    "rand_skip": {"data": ("data_param", "rand_skip"), "images": ("image_data_param", "rand_skip")},
    "shuffle_images": {"images": ("image_data_param", "shuffle")},
    "new_height": {"images": ("image_data_param", "new_height")},
    "new_width": {"images": ("image_data_param", "new_width")},
    "concat_dim": {"concat": ("concat_param", "concat_dim")},
    "det_fg_threshold": {"window_data": ("window_data_param", "fg_threshold")},
    "det_bg_threshold": {"window_data": ("window_data_param", "bg_threshold")},
    "det_fg_fraction": {"window_data": ("window_data_param", "fg_fraction")},
    "det_context_pad": {"window_data": ("window_data_param", "context_pad")},
    "det_crop_mode": {"window_data": ("window_data_param", "crop_mode")},
    "hdf5_output_param": {"hdf5_output": ("hdf5_output_param", "")},  # "" = the whole message
}
# V0 fields that go to transform_param whatever the layer type.
_V0_TRANSFORM_FIELDS = {"scale": "scale", "meanfile": "mean_file", "cropsize": "crop_size",
                        "mirror": "mirror"}

_SOLVER_TYPE_NAMES = {
    caffe_pb2.SolverParameter.SGD: "SGD", caffe_pb2.SolverParameter.NESTEROV: "Nesterov",
    caffe_pb2.SolverParameter.ADAGRAD: "AdaGrad", caffe_pb2.SolverParameter.RMSPROP: "RMSProp",
    caffe_pb2.SolverParameter.ADADELTA: "AdaDelta", caffe_pb2.SolverParameter.ADAM: "Adam",
}


# --------------------------------------------------------------------------------------------
# What needs upgrading
# --------------------------------------------------------------------------------------------

def needs_v0_upgrade(net: caffe_pb2.NetParameter) -> bool:
    """Any `layers` entry nests a V0 `layer { }`."""
    return any(layer.HasField("layer") for layer in net.layers)


def needs_data_upgrade(net: caffe_pb2.NetParameter) -> bool:
    """A V1 data layer keeps scale / mean_file / crop_size / mirror in its own params."""
    for layer in net.layers:
        params_field = _DATA_LAYER_PARAMS.get(layer.type)
        if params_field and any(getattr(layer, params_field).HasField(f)
                                for f in _OLD_TRANSFORM_FIELDS):
            return True
    return False


def needs_v1_upgrade(net: caffe_pb2.NetParameter) -> bool:
    """The net uses the V1 `layers` list."""
    return len(net.layers) > 0


def needs_input_upgrade(net: caffe_pb2.NetParameter) -> bool:
    """The net declares inputs with net-level `input` fields."""
    return len(net.input) > 0


def needs_batchnorm_upgrade(net: caffe_pb2.NetParameter) -> bool:
    """A BatchNorm layer declares exactly three `param`s (the old way to freeze its statistics)."""
    return any(layer.type == "BatchNorm" and len(layer.param) == 3 for layer in net.layer)


def needs_upgrade(net: caffe_pb2.NetParameter) -> bool:
    """Whether `upgrade_net` would change anything."""
    return (needs_v0_upgrade(net) or needs_v1_upgrade(net) or needs_data_upgrade(net)
            or needs_input_upgrade(net) or needs_batchnorm_upgrade(net))


# --------------------------------------------------------------------------------------------
# Nets
# --------------------------------------------------------------------------------------------

def upgrade_net(net: caffe_pb2.NetParameter, *, source: str | None = None) -> caffe_pb2.NetParameter:
    """Return `net` upgraded to the current format; `source` names the file in messages."""
    where = source or "<net>"
    upgraded = caffe_pb2.NetParameter()
    upgraded.CopyFrom(net)
    if needs_v0_upgrade(upgraded):
        upgraded = upgrade_v0_net(upgraded, source=where)
    if needs_data_upgrade(upgraded):
        _upgrade_data_transformation(upgraded)
    if needs_v1_upgrade(upgraded):
        upgraded = upgrade_v1_net(upgraded, source=where)
    if needs_input_upgrade(upgraded):
        _upgrade_net_input(upgraded, where)
    if needs_batchnorm_upgrade(upgraded):
        _upgrade_batchnorm(upgraded)
    return upgraded


def upgrade_v0_net(net: caffe_pb2.NetParameter, *, source: str = "<net>") -> caffe_pb2.NetParameter:
    """V0 -> V1: fold padding layers, then turn each V0 layer into a V1 layer.

    Like Caffe, the result keeps only the net's name, input, input_dim and force_backward.
    """
    padded = _fold_v0_padding_layers(net, source)
    upgraded = caffe_pb2.NetParameter()
    if padded.HasField("name"):
        upgraded.name = padded.name
    problems: list[str] = []
    for connection in padded.layers:
        problems += _upgrade_v0_layer(connection, upgraded.layers.add(), source)
    upgraded.input.extend(padded.input)
    upgraded.input_dim.extend(padded.input_dim)
    if padded.HasField("force_backward"):
        upgraded.force_backward = padded.force_backward
    for problem in problems:
        _warn(source, f"V0 upgrade: {problem}; continuing")
    return upgraded


def upgrade_v1_net(net: caffe_pb2.NetParameter, *, source: str = "<net>") -> caffe_pb2.NetParameter:
    """V1 -> V2: every `layers` entry becomes a `layer`; all other net fields are kept."""
    if len(net.layer) > 0:
        raise CaffeUpgradeError(
            "refusing to upgrade an inconsistent net: it has both `layer` (current) and "
            "`layers` (V1) entries", filename=source,
            hint='Rewrite the V1 `layers { type: ENUM }` blocks as `layer { type: "Name" }`.',
        )
    upgraded = caffe_pb2.NetParameter()
    upgraded.CopyFrom(net)
    upgraded.ClearField("layers")
    for index, v1_layer in enumerate(net.layers):
        if not _upgrade_v1_layer(v1_layer, upgraded.layer.add()):
            _warn(source, f"layer {index} ({v1_layer.name!r}) still holds a V0 `layer` block, "
                          "which was ignored")
    return upgraded


def _fold_v0_padding_layers(net: caffe_pb2.NetParameter, source: str) -> caffe_pb2.NetParameter:
    """Drop V0 "padding" layers, moving their pad into the conv / pool layer they feed."""
    folded = caffe_pb2.NetParameter()
    folded.CopyFrom(net)
    folded.ClearField("layers")
    last_producer = {name: -1 for name in net.input}  # blob -> index of the layer that made it
    for index, connection in enumerate(net.layers):
        v0 = connection.layer
        if v0.type != "padding":
            folded.layers.add().CopyFrom(connection)
        for bottom_index, blob in enumerate(connection.bottom):
            if blob not in last_producer:
                raise CaffeUpgradeError(f"V0 layer {index} ({v0.name!r}) reads unknown blob "
                                        f"{blob!r}", filename=source)
            producer_index = last_producer[blob]
            if producer_index == -1:
                continue
            producer = net.layers[producer_index]
            if producer.layer.type != "padding":
                continue
            if v0.type not in ("conv", "pool"):
                raise CaffeUpgradeError(f"padding layer {producer.layer.name!r} feeds layer "
                                        f"{v0.name!r} of type {v0.type!r}; only conv and pool "
                                        "may follow a padding layer", filename=source)
            if len(connection.bottom) != 1 or len(producer.bottom) != 1 or len(producer.top) != 1:
                raise CaffeUpgradeError(f"padding layer {producer.layer.name!r} and layer "
                                        f"{v0.name!r} must each have a single input and output",
                                        filename=source)
            receiver = folded.layers[-1]
            receiver.layer.pad = producer.layer.pad
            receiver.bottom[bottom_index] = producer.bottom[0]
        for blob in connection.top:
            last_producer[blob] = index
    return folded


def _upgrade_v0_layer(connection: caffe_pb2.V1LayerParameter,
                      out: caffe_pb2.V1LayerParameter, source: str) -> list[str]:
    """Fill `out` (V1) from a V0 layer; return Caffe's "unknown parameter" complaints."""
    out.bottom.extend(connection.bottom)
    out.top.extend(connection.top)
    if not connection.HasField("layer"):
        return []
    v0 = connection.layer
    layer_type = v0.type
    if v0.HasField("name"):
        out.name = v0.name
    if v0.HasField("type"):
        if layer_type not in V0_LAYER_TYPES:
            raise CaffeUpgradeError(f"unknown V0 layer type {layer_type!r} (layer {v0.name!r})",
                                    filename=source,
                                    hint=f"V0 types: {', '.join(sorted(V0_LAYER_TYPES))}")
        out.type = V0_LAYER_TYPES[layer_type]
    out.blobs.extend(v0.blobs)
    out.blobs_lr.extend(v0.blobs_lr)
    out.weight_decay.extend(v0.weight_decay)
    problems = []
    for v0_field, targets in _V0_FIELD_TARGETS.items():
        if not v0.HasField(v0_field):
            continue
        if layer_type not in targets:
            problems.append(f"unknown parameter {v0_field} for layer type {layer_type!r} "
                            f"(layer {v0.name!r})")
            continue
        params_name, field = targets[layer_type]
        _assign(getattr(out, params_name), field, getattr(v0, v0_field))
    for v0_field, field in _V0_TRANSFORM_FIELDS.items():
        if v0.HasField(v0_field):
            setattr(out.transform_param, field, getattr(v0, v0_field))
    return problems


def _assign(params, field: str, value) -> None:
    """Set params.field = value, whatever the kind of field (scalar, repeated, message, whole)."""
    if not field:
        params.CopyFrom(value)
        return
    descriptor = params.DESCRIPTOR.fields_by_name[field]
    if descriptor.message_type is not None:
        getattr(params, field).CopyFrom(value)
    elif _is_repeated(descriptor):
        getattr(params, field).append(value)
    else:
        setattr(params, field, value)


def _is_repeated(descriptor) -> bool:
    is_repeated = getattr(descriptor, "is_repeated", None)  # protobuf >= 6.31
    if is_repeated is not None:
        return bool(is_repeated)
    return descriptor.label == descriptor.LABEL_REPEATED


def _upgrade_data_transformation(net: caffe_pb2.NetParameter) -> None:
    """Move scale / mean_file / crop_size / mirror of V1 data layers into transform_param."""
    for layer in net.layers:
        params_field = _DATA_LAYER_PARAMS.get(layer.type)
        if params_field is None:
            continue
        params = getattr(layer, params_field)
        params.SetInParent()  # Caffe touches both messages through mutable_*()
        layer.transform_param.SetInParent()
        for field in _OLD_TRANSFORM_FIELDS:
            if params.HasField(field):
                setattr(layer.transform_param, field, getattr(params, field))
                params.ClearField(field)


def _upgrade_v1_layer(v1: caffe_pb2.V1LayerParameter, out: caffe_pb2.LayerParameter) -> bool:
    """Fill `out` (V2) from a V1 layer; False when a nested V0 block had to be ignored."""
    out.bottom.extend(v1.bottom)
    out.top.extend(v1.top)
    if v1.HasField("name"):
        out.name = v1.name
    out.include.extend(v1.include)
    out.exclude.extend(v1.exclude)
    if v1.HasField("type"):
        out.type = V1_LAYER_TYPE_NAMES[v1.type]
    out.blobs.extend(v1.blobs)

    def param(index: int) -> caffe_pb2.ParamSpec:
        while len(out.param) <= index:
            out.param.add()
        return out.param[index]

    for index, name in enumerate(v1.param):
        param(index).name = name
    for index, mode in enumerate(v1.blob_share_mode):
        param(index).share_mode = mode  # V1 and ParamSpec DimCheckMode share their numbers
    for index, lr in enumerate(v1.blobs_lr):
        param(index).lr_mult = lr
    for index, decay in enumerate(v1.weight_decay):
        param(index).decay_mult = decay
    out.loss_weight.extend(v1.loss_weight)
    for field in _V1_COPIED_PARAMS:
        if v1.HasField(field):
            getattr(out, field).CopyFrom(getattr(v1, field))
    return not v1.HasField("layer")


def _upgrade_net_input(net: caffe_pb2.NetParameter, source: str) -> None:
    """Turn net-level input / input_shape / input_dim into an Input layer named "input", first."""
    has_shape, has_dim = len(net.input_shape) > 0, len(net.input_dim) > 0
    if has_shape or has_dim:
        count = len(net.input)
        if has_shape and len(net.input_shape) < count:
            raise CaffeUpgradeError(f"{count} inputs but only {len(net.input_shape)} input_shape "
                                    "entries", filename=source)
        if not has_shape and len(net.input_dim) < 4 * count:
            raise CaffeUpgradeError(f"{count} inputs need {4 * count} input_dim values (4 per "
                                    f"input), the net gives {len(net.input_dim)}", filename=source)
        layer = caffe_pb2.LayerParameter(name="input", type="Input")
        for index, blob in enumerate(net.input):
            layer.top.append(blob)
            shape = layer.input_param.shape.add()
            if has_shape:
                shape.CopyFrom(net.input_shape[index])
            else:
                shape.dim.extend(net.input_dim[4 * index:4 * index + 4])
        layers = [layer] + list(net.layer)
        net.ClearField("layer")
        net.layer.extend(layers)
    # An input without shapes is an old caffemodel: dropping the fields is the whole upgrade.
    net.ClearField("input")
    net.ClearField("input_shape")
    net.ClearField("input_dim")


def _upgrade_batchnorm(net: caffe_pb2.NetParameter) -> None:
    """BatchNorm layers with three declared params: force lr_mult and decay_mult to 0."""
    for layer in net.layer:
        if layer.type == "BatchNorm" and len(layer.param) == 3:
            for spec in layer.param:
                spec.lr_mult = 0.0
                spec.decay_mult = 0.0


# --------------------------------------------------------------------------------------------
# Solvers
# --------------------------------------------------------------------------------------------

def upgrade_solver(solver: caffe_pb2.SolverParameter, *,
                   source: str | None = None) -> caffe_pb2.SolverParameter:
    """Return `solver` with the legacy `solver_type` enum turned into the `type` string."""
    upgraded = caffe_pb2.SolverParameter()
    upgraded.CopyFrom(solver)
    if not upgraded.HasField("solver_type"):
        return upgraded
    if upgraded.HasField("type"):
        raise CaffeUpgradeError(
            "the solver sets both the old `solver_type` (enum) and the new `type` (string)",
            filename=source or "<solver>", hint="Keep only `type`, e.g. type: \"Adam\".",
        )
    upgraded.type = _SOLVER_TYPE_NAMES[upgraded.solver_type]
    upgraded.ClearField("solver_type")
    return upgraded


def upgrade_snapshot_prefix(solver: caffe_pb2.SolverParameter,
                            solver_path: str | os.PathLike[str]) -> caffe_pb2.SolverParameter:
    """Caffe's snapshot_prefix rule for a solver read from `solver_path` (returns a copy).

    Unset: the solver path without its extension. An existing directory: that directory joined
    with the solver file's stem.
    """
    upgraded = caffe_pb2.SolverParameter()
    upgraded.CopyFrom(solver)
    path = os.fspath(solver_path)
    if not upgraded.HasField("snapshot_prefix"):
        upgraded.snapshot_prefix = os.path.splitext(path)[0]
    elif os.path.isdir(upgraded.snapshot_prefix):
        stem = os.path.splitext(os.path.basename(path))[0]
        upgraded.snapshot_prefix = os.path.join(upgraded.snapshot_prefix, stem)
    return upgraded


def _warn(source: str, message: str) -> None:
    warnings.warn(f"{source}: {message}", CaffeUpgradeWarning, stacklevel=3)
