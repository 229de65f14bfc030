"""``caffe.net_spec``: write nets in Python, get NetParameter protos (``caffe.layers``, ``caffe.params``).

    from cgvm.caffe import layers as L, params as P, NetSpec
    n = NetSpec()
    n.data, n.label = L.DummyData(shape=[dict(dim=[64, 1, 28, 28]), dict(dim=[64])], ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    open("net.prototxt", "w").write(str(n.to_proto()))

Keyword rules, as in pycaffe: ``ntop`` (number of tops; 0 returns the layer itself) and
``in_place`` are consumed; keys ending in ``param`` go to that LayerParameter field; other keys
go to the type's own ``<type>_param`` message when it has that field, else to the
LayerParameter itself (``name``, ``loss_weight``, ``include``...). Lists fill repeated fields
(a list of dicts: repeated messages), dicts fill messages, a scalar for a repeated field
becomes a one-element list. Unnamed layers and tops get ``<Type><k>`` names.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Any, Dict, Tuple

from cgvm.frontends.caffe import caffe_pb2

__all__ = ["layers", "params", "NetSpec", "to_proto", "Top", "Function", "param_name_dict"]


def param_name_dict() -> Dict[str, str]:
    """Parameter message type stem -> LayerParameter field stem, e.g. "Convolution" -> "convolution"."""
    out = {}
    for field in caffe_pb2.LayerParameter.DESCRIPTOR.fields:
        if field.name.endswith("_param") and field.message_type is not None:
            type_name = field.message_type.name
            if type_name.endswith("Parameter"):
                out[type_name[:-len("Parameter")]] = field.name[:-len("_param")]
    return out


_param_names = param_name_dict()


def to_proto(*tops: "Top") -> caffe_pb2.NetParameter:
    """A NetParameter with every layer needed to compute ``tops`` (auto-named)."""
    layers: "OrderedDict[Function, caffe_pb2.LayerParameter]" = OrderedDict()
    autonames: Counter = Counter()
    for top in tops:
        top.fn._to_proto(layers, {}, autonames)
    net = caffe_pb2.NetParameter()
    net.layer.extend(layers.values())
    return net


def assign_proto(proto: Any, name: str, value: Any) -> None:
    """Set field ``name`` of ``proto`` from a Python value (lists, dicts and scalars, recursively)."""
    field = getattr(proto, name)
    repeated = hasattr(field, "extend")
    if repeated and not isinstance(value, (list, tuple)):
        value = [value]
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], dict):
            for item in value:
                message = field.add()
                for key, v in item.items():
                    assign_proto(message, key, v)
        else:
            field.extend(value)
    elif isinstance(value, dict):
        for key, v in value.items():
            assign_proto(field, key, v)
    else:
        setattr(proto, name, value)


class Top:
    """One output of a layer (a blob), used as the input of later layers."""

    def __init__(self, fn: "Function", n: int):
        self.fn = fn
        self.n = n

    def to_proto(self) -> caffe_pb2.NetParameter:
        """The net that computes this top."""
        return to_proto(self)

    def _to_proto(self, layers, names, autonames) -> None:
        return self.fn._to_proto(layers, names, autonames)


class Function:
    """A layer not yet written: its type, inputs and keyword parameters."""

    def __init__(self, type_name: str, inputs: Tuple[Any, ...], params: Dict[str, Any]):
        self.type_name = type_name
        for index, value in enumerate(inputs):
            if not isinstance(value, Top):
                raise TypeError(f"{type_name} input {index} is not a Top (type is {type(value)})")
        self.inputs = inputs
        self.params = dict(params)
        self.ntop = self.params.pop("ntop", 1)
        self.in_place = self.params.pop("in_place", False)
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _get_name(self, names, autonames) -> str:
        if self not in names and self.ntop > 0:
            names[self] = self._get_top_name(self.tops[0], names, autonames)
        elif self not in names:
            autonames[self.type_name] += 1
            names[self] = self.type_name + str(autonames[self.type_name])
        return names[self]

    def _get_top_name(self, top: Top, names, autonames) -> str:
        if top not in names:
            autonames[top.fn.type_name] += 1
            names[top] = top.fn.type_name + str(autonames[top.fn.type_name])
        return names[top]

    def _to_proto(self, layers, names, autonames) -> None:
        if self in layers:
            return
        bottom_names = []
        for inp in self.inputs:
            inp._to_proto(layers, names, autonames)
            bottom_names.append(layers[inp.fn].top[inp.n])
        layer = caffe_pb2.LayerParameter()
        layer.type = self.type_name
        layer.bottom.extend(bottom_names)
        if self.in_place:
            layer.top.extend(layer.bottom)
        else:
            for top in self.tops:
                layer.top.append(self._get_top_name(top, names, autonames))
        layer.name = self._get_name(names, autonames)
        for key, value in self.params.items():
            if key.endswith("param"):
                assign_proto(layer, key, value)
                continue
            try:
                assign_proto(getattr(layer, _param_names[self.type_name] + "_param"), key, value)
            except (AttributeError, KeyError):
                assign_proto(layer, key, value)
        layers[self] = layer


class NetSpec:
    """Tops assigned as attributes (``n.conv1 = L.Convolution(...)``) name their layers and blobs."""

    def __init__(self) -> None:
        super().__setattr__("tops", OrderedDict())

    def __setattr__(self, name: str, value: Top) -> None:
        self.tops[name] = value

    def __getattr__(self, name: str) -> Top:
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setitem__(self, key: str, value: Top) -> None:
        self.__setattr__(key, value)

    def __getitem__(self, item: str) -> Top:
        return self.__getattr__(item)

    def __delitem__(self, name: str) -> None:
        del self.tops[name]

    def keys(self):
        return list(self.tops.keys())

    def vals(self):
        return list(self.tops.values())

    def to_proto(self) -> caffe_pb2.NetParameter:
        names = {v: k for k, v in self.tops.items()}
        autonames: Counter = Counter()
        layers: "OrderedDict[Function, caffe_pb2.LayerParameter]" = OrderedDict()
        for top in self.tops.values():
            top._to_proto(layers, names, autonames)
        net = caffe_pb2.NetParameter()
        net.layer.extend(layers.values())
        return net


class Layers:
    """``L.<Type>(*bottoms, **params)``: one Top, a tuple of Tops (``ntop`` > 1), or the layer (``ntop=0``)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def layer_fn(*args: Any, **kwargs: Any):
            fn = Function(name, args, kwargs)
            if fn.ntop == 0:
                return fn
            if fn.ntop == 1:
                return fn.tops[0]
            return fn.tops
        return layer_fn


class Parameters:
    """``P.<Type>.<ENUM>``: enum values of ``caffe_pb2.<Type>Parameter`` (``P.Pooling.MAX``)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        class Param:
            def __getattr__(self, param_name: str):
                return getattr(getattr(caffe_pb2, name + "Parameter"), param_name)
        return Param()


layers = Layers()
params = Parameters()
