"""conv, conv_transpose and the conv gradient ops against direct NumPy loops, Caffe's numbers and PyTorch."""
import numpy as np
import pytest

import cgvm
from cgvm.errors import GraphBuildError, ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import conv as CV
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R
from harness import Case, check_case, check_grad, pad_pairs, spatial

rng = np.random.default_rng(7)


def r(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------- references (plain loops)



def ref_conv(x, w, b=None, stride=1, pad=0, dilation=1, groups=1):
    """y[n, o, p] = b[o] + sum_{c in group(o), k} w[o, c, k] * x[n, c, p*s - pad + k*d] (zero outside)."""
    nsp = x.ndim - 2
    s, d, pads = spatial(stride, nsp), spatial(dilation, nsp), pad_pairs(pad, nsp)
    xpad = np.pad(x, [(0, 0), (0, 0)] + pads)
    n, o, cg, ksize = x.shape[0], w.shape[0], w.shape[1], w.shape[2:]
    og = o // groups
    outs = [(xpad.shape[2 + i] - d[i] * (ksize[i] - 1) - 1) // s[i] + 1 for i in range(nsp)]
    y = np.zeros((n, o) + tuple(outs), dtype=x.dtype)
    for p in np.ndindex(*outs):
        idx = np.ix_(*[p[i] * s[i] + np.arange(ksize[i]) * d[i] for i in range(nsp)])
        patch = xpad[(slice(None), slice(None)) + idx]
        for g in range(groups):
            pg = patch[:, g * cg:(g + 1) * cg].reshape(n, -1)
            wg = w[g * og:(g + 1) * og].reshape(og, -1)
            y[(slice(None), slice(g * og, (g + 1) * og)) + p] = pg @ wg.T
    if b is not None:
        y += b.reshape((1, -1) + (1,) * nsp)
    return y


def ref_conv_grad_input(g, w, in_sizes, stride=1, pad=0, dilation=1, groups=1):
    """Scatter: each g[n, o, p] adds w[o, c, k] * g to dx[n, c, p*s - pad + k*d] (dropped when outside)."""
    nsp = g.ndim - 2
    s, d, pads = spatial(stride, nsp), spatial(dilation, nsp), pad_pairs(pad, nsp)
    n, o = g.shape[:2]
    cg, ksize = w.shape[1], w.shape[2:]
    og = o // groups
    full = np.zeros((n, cg * groups) + tuple(in_sizes[i] + pads[i][0] + pads[i][1] + s[i] * 2 + d[i] * ksize[i]
                                             for i in range(nsp)), dtype=g.dtype)
    for oc in range(o):
        grp = oc // og
        for p in np.ndindex(*g.shape[2:]):
            for k in np.ndindex(*ksize):
                pos = tuple(p[i] * s[i] + k[i] * d[i] for i in range(nsp))
                full[(slice(None), slice(grp * cg, (grp + 1) * cg)) + pos] += \
                    g[(slice(None), oc) + p][:, None] * w[(oc, slice(None)) + k][None, :]
    crop = tuple(slice(pads[i][0], pads[i][0] + in_sizes[i]) for i in range(nsp))
    return full[(slice(None), slice(None)) + crop]


def ref_conv_grad_weight(x, g, ksize, stride=1, pad=0, dilation=1, groups=1):
    """dw[o, c, k] = sum_{n, p} g[n, o, p] * x[n, group(o)*C/g + c, p*s - pad + k*d]."""
    nsp = x.ndim - 2
    s, d, pads = spatial(stride, nsp), spatial(dilation, nsp), pad_pairs(pad, nsp)
    xpad = np.pad(x, [(0, 0), (0, 0)] + pads)
    o = g.shape[1]
    cg = x.shape[1] // groups
    og = o // groups
    dw = np.zeros((o, cg) + tuple(ksize), dtype=x.dtype)
    for oc in range(o):
        grp = oc // og
        for k in np.ndindex(*ksize):
            for p in np.ndindex(*g.shape[2:]):
                pos = tuple(p[i] * s[i] + k[i] * d[i] for i in range(nsp))
                patch = xpad[(slice(None), slice(grp * cg, (grp + 1) * cg)) + pos]  # (N, C/g)
                dw[(oc, slice(None)) + k] += g[(slice(None), oc) + p] @ patch
    return dw


def ref_conv_transpose(x, w, b=None, stride=1, pad=0, dilation=1, groups=1, output_padding=0):
    nsp = x.ndim - 2
    s, d, pads = spatial(stride, nsp), spatial(dilation, nsp), pad_pairs(pad, nsp)
    extra = spatial(output_padding, nsp)
    sizes = [(x.shape[2 + i] - 1) * s[i] + d[i] * (w.shape[2 + i] - 1) + 1 - pads[i][0] - pads[i][1] + extra[i]
             for i in range(nsp)]
    y = ref_conv_grad_input(x, w, sizes, stride, pad, dilation, groups)
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nsp)
    return y


# --------------------------------------------------------------------------- cases

def conv_case(name, x, w, b=None, dynamic=False, **attrs):
    inputs = [x, w] + ([b] if b is not None else [])
    return Case(name, lambda *v: CV.conv(*v, **attrs), inputs,
                lambda *a: ref_conv(*a, **attrs), dynamic=dynamic, rtol=1e-4, atol=1e-5)


def deconv_case(name, x, w, b=None, dynamic=False, **attrs):
    inputs = [x, w] + ([b] if b is not None else [])
    return Case(name, lambda *v: CV.conv_transpose(*v, **attrs), inputs,
                lambda *a: ref_conv_transpose(*a, **attrs), dynamic=dynamic, rtol=1e-4, atol=1e-5)


def grad_input_case(name, g, w, x_shape, dynamic=False, **attrs):
    like = np.zeros(x_shape, np.float32)
    return Case(name, lambda gv, wv, xv: CV.conv_grad_input(gv, wv, xv, **attrs), [g, w, like],
                lambda ga, wa, xa: ref_conv_grad_input(ga, wa, xa.shape[2:], **attrs),
                grad_inputs=[0, 1], dynamic=dynamic, rtol=1e-4, atol=1e-5)


def grad_weight_case(name, x, g, w_shape, dynamic=False, **attrs):
    like = np.zeros(w_shape, np.float32)
    return Case(name, lambda xv, gv, wv: CV.conv_grad_weight(xv, gv, wv, **attrs), [x, g, like],
                lambda xa, ga, wa: ref_conv_grad_weight(xa, ga, wa.shape[2:], **attrs),
                grad_inputs=[0, 1], dynamic=dynamic, rtol=1e-4, atol=1e-5)


def second_order_case():
    """grad of sum(conv(x, w)^2) wrt w is itself differentiated by check_grad (wrt x and w)."""
    def build(x, w):
        y = CV.conv(x, w, stride=2, pad=1)
        return cgvm.grad(R.sum(E.mul(y, y)), w)

    def reference(x, w):
        y = ref_conv(x, w, stride=2, pad=1)
        return ref_conv_grad_weight(x, 2 * y, w.shape[2:], stride=2, pad=1)
    return Case("conv_second_order", build, [r(2, 2, 5, 5), r(3, 2, 3, 3)], reference, rtol=1e-4, atol=1e-4)


CASES = [
    conv_case("conv2d", r(2, 3, 5, 6), r(4, 3, 3, 3), r(4)),
    conv_case("conv2d_nobias", r(2, 3, 5, 5), r(2, 3, 2, 2)),
    conv_case("conv2d_stride2_pad1", r(2, 3, 7, 6), r(4, 3, 3, 3), r(4), stride=2, pad=1),
    conv_case("conv2d_floor_unused_row", r(1, 2, 8, 8), r(3, 2, 3, 3), stride=2),
    conv_case("conv2d_dilation", r(1, 2, 7, 7), r(3, 2, 3, 3), r(3), dilation=2, pad=2),
    conv_case("conv2d_groups_rect", r(2, 4, 6, 5), r(6, 2, 2, 3), r(6), groups=2, stride=(2, 1), pad=(1, 0)),
    conv_case("conv2d_depthwise_mult2", r(2, 3, 5, 5), r(6, 1, 3, 3), r(6), groups=3, pad=1),
    conv_case("conv2d_depthwise", r(2, 4, 5, 5), r(4, 1, 3, 3), groups=4, pad=1, stride=2),
    conv_case("conv2d_asym_pad", r(1, 2, 5, 5), r(2, 2, 3, 3), pad=(0, 1, 2, 1)),
    conv_case("conv2d_pointwise_groups", r(2, 4, 3, 3), r(6, 2, 1, 1), r(6), groups=2),
    conv_case("conv1d", r(2, 3, 9), r(4, 3, 3), r(4), stride=2, pad=1),
    conv_case("conv1d_asym_pad", r(2, 2, 6), r(3, 2, 4), pad=(3, 0)),
    conv_case("conv3d", r(1, 2, 4, 5, 4), r(3, 2, 2, 3, 2), r(3), stride=(1, 2, 1), pad=1),
    conv_case("conv2d_dynamic", r(2, 3, 7, 6), r(4, 3, 3, 3), r(4), dynamic=True, stride=2, pad=1),
    conv_case("conv2d_groups_dynamic", r(1, 4, 5, 6), r(4, 2, 3, 2), dynamic=True, groups=2, dilation=(1, 2)),
    deconv_case("deconv2d", r(2, 4, 3, 3), r(4, 3, 3, 3), r(3), stride=2),
    deconv_case("deconv2d_pad_outpad", r(1, 2, 4, 3), r(2, 3, 3, 3), r(3), stride=2, pad=1, output_padding=1),
    deconv_case("deconv2d_groups_dilation", r(1, 4, 3, 4), r(4, 1, 2, 2), groups=2, dilation=2, stride=(1, 2)),
    deconv_case("deconv2d_pointwise", r(2, 3, 3, 3), r(3, 2, 1, 1), r(2)),
    deconv_case("deconv1d", r(2, 3, 5), r(3, 2, 4), r(2), stride=3, pad=1),
    deconv_case("deconv3d", r(1, 2, 2, 3, 2), r(2, 2, 2, 2, 3), stride=2, pad=(0, 1, 1)),
    deconv_case("deconv2d_dynamic", r(2, 2, 3, 4), r(2, 3, 3, 2), r(3), dynamic=True, stride=2, pad=1,
                output_padding=(1, 0)),
    grad_input_case("conv_grad_input", r(2, 4, 4, 4), r(4, 3, 3, 3), (2, 3, 7, 8), stride=2, pad=1),
    grad_input_case("conv_grad_input_groups", r(1, 4, 4, 4), r(4, 1, 3, 3), (1, 2, 6, 6), groups=2, dilation=1),
    grad_input_case("conv_grad_input_dynamic", r(2, 2, 3, 1), r(2, 3, 2, 3), (2, 3, 6, 5), dynamic=True,
                    stride=2, dilation=(1, 2)),
    grad_weight_case("conv_grad_weight", r(2, 3, 7, 8), r(2, 4, 4, 4), (4, 3, 3, 3), stride=2, pad=1),
    grad_weight_case("conv_grad_weight_groups", r(1, 4, 5, 5), r(1, 6, 3, 3), (6, 2, 3, 3), groups=2),
    grad_weight_case("conv_grad_weight_dynamic", r(2, 2, 6), r(2, 3, 3), (3, 2, 2), dynamic=True, stride=2,
                     pad=(1, 0)),
    second_order_case(),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)


# --------------------------------------------------------------------------- Caffe's own tests

def _run(build, *arrays):
    syms = [input_value(TensorType(a.shape, a.dtype), f"in{i}") for i, a in enumerate(arrays)]
    return cgvm.compile(syms, [build(*syms)])(*arrays)[0]


def test_caffe_simple_deconvolution():
    # test_deconvolution_layer.cpp: ones in, weights 1, bias 0.1, kernel 3 stride 2, 2x3x6x4 -> 2x4x13x9
    x = np.ones((2, 3, 6, 4), np.float32)
    w = np.ones((3, 4, 3, 3), np.float32)
    b = np.full(4, 0.1, np.float32)
    y = _run(lambda *v: CV.conv_transpose(*v, stride=2), x, w, b)
    assert y.shape == (2, 4, 13, 9)
    overlap_h = [0 < h < 12 and h % 2 == 0 for h in range(13)]
    overlap_w = [0 < c < 8 and c % 2 == 0 for c in range(9)]
    want = np.array([[3.1 + 3 * (oh + ow) + 3 * (oh and ow) for ow in overlap_w] for oh in overlap_h], np.float32)
    np.testing.assert_allclose(y, np.broadcast_to(want, y.shape), rtol=1e-6)
    assert {round(float(v), 4) for v in np.unique(y)} == {3.1, 6.1, 12.1}


def test_caffe_setup_shapes():
    x = np.zeros((2, 3, 6, 4), np.float32)
    assert _run(lambda v, w: CV.conv(v, w, stride=2), x, np.zeros((4, 3, 3, 3), np.float32)).shape == (2, 4, 2, 1)
    assert _run(lambda v, w: CV.conv(v, w, stride=2, groups=3), x,
                np.zeros((3, 1, 3, 3), np.float32)).shape == (2, 3, 2, 1)
    assert _run(lambda v, w: CV.conv_transpose(v, w, stride=2, groups=3), x,
                np.zeros((3, 1, 3, 3), np.float32)).shape == (2, 3, 13, 9)


def test_caffe_sobel_separable():
    # test_convolution_layer.cpp TestSobelConvolution: no kernel flip; rectangular kernels and strides
    x = r(2, 3, 6, 4)
    sobel = np.tile(np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.float32), (1, 3, 1, 1))
    full = _run(lambda v, w: CV.conv(v, w, stride=2), x, sobel)
    vertical = np.tile(np.array([1, 2, 1], np.float32).reshape(3, 1), (1, 3, 1, 1))
    step1 = _run(lambda v, w: CV.conv(v, w, stride=(2, 1)), x, vertical)
    horizontal = np.array([-1, 0, 1], np.float32).reshape(1, 1, 1, 3)
    step2 = _run(lambda v, w: CV.conv(v, w, stride=(1, 2)), step1, horizontal)
    np.testing.assert_allclose(full, step2, rtol=1e-4, atol=1e-4)


def test_nd_matches_2d_with_unit_axis():
    x, w = r(2, 3, 5, 6), r(4, 3, 3, 2)
    two = _run(lambda v, u: CV.conv(v, u, stride=2, pad=1), x, w)
    three = _run(lambda v, u: CV.conv(v, u, stride=(1, 2, 2), pad=(0, 1, 1)), x[:, :, None], w[:, :, None])
    np.testing.assert_allclose(three[:, :, 0], two, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cfg", [
    dict(x=(2, 3, 9, 7), w=(4, 3, 3, 3), bias=True, stride=2, pad=1),          # bias rides in the GEMM (few rows)
    dict(x=(1, 8, 7, 6), w=(6, 4, 3, 2), bias=True, stride=1, pad=(1, 0), groups=2),
    dict(x=(2, 40, 6, 5), w=(3, 40, 2, 2), bias=True, stride=1, pad=0),         # bias added after the GEMM
    dict(x=(2, 2, 11), w=(3, 2, 3), bias=False, stride=2, pad=2),               # 1-D
    dict(x=(1, 2, 4, 5, 6), w=(3, 2, 2, 3, 2), bias=True, stride=1, pad=1),     # 3-D
])
def test_im2col_in_bands_of_output_rows_matches_the_loop(monkeypatch, cfg):
    """A sample whose columns exceed the budget is done a band of output rows at a time (the
    last band shorter); with a budget of one byte every band is one row."""
    from cgvm.ops.kernels import conv_im2col as ci
    from cgvm.ops.conv_geometry import ConvGeometry
    from cgvm.ops.kernels.scratch import layout_bytes

    x, w = r(*cfg["x"]), r(*cfg["w"])
    b = r(w.shape[0]) if cfg["bias"] else None
    nsp = x.ndim - 2
    stride, pad, groups = spatial(cfg["stride"], nsp), cfg["pad"], cfg.get("groups", 1)
    geo = ConvGeometry(nsp, stride, spatial(pad, nsp) if isinstance(pad, int) else pad, (1,) * nsp, groups)
    want = ref_conv(x, w, b, stride=cfg["stride"], pad=pad, groups=groups)
    for budget in (1, 3 * 4 * w[0].size):        # one row a band; a few rows, ragged last band
        monkeypatch.setattr(ci, "COLUMN_BUDGET_BYTES", budget)
        layout = ci.forward_layout(x.shape, w.shape, b is not None, np.float32, geo, ("im2col", 0))
        scratch = np.empty(layout_bytes(layout), np.uint8)
        got = ci.conv_forward(np, x, w, b, geo, None, scratch)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        if budget == 1:
            assert dict((name, shape) for name, shape, _ in layout)["cols"][-1] == \
                int(np.prod(want.shape[3:]))   # columns of one output row


@pytest.mark.parametrize("cfg", [
    dict(x=(5, 1, 12, 30), w=(4, 1, 3, 3), stride=1, pad=0),                 # LeNet-like: one input channel
    dict(x=(3, 4, 12, 13), w=(6, 2, 3, 3), stride=1, pad=1, groups=2),
    dict(x=(2, 3, 30, 29), w=(5, 3, 5, 4), stride=2, pad=(2, 1)),
    dict(x=(3, 2, 140), w=(3, 2, 5), stride=1, pad=2),                        # 1-D
    dict(x=(2, 2, 6, 7, 6), w=(3, 2, 2, 3, 2), stride=1, pad=1),              # 3-D
])
def test_weight_gradient_as_per_sample_products_matches_the_loop(monkeypatch, cfg):
    """A small dw over many positions a sample is summed from per-sample products (one chunk of
    samples, then a budget that makes a chunk of every sample)."""
    from cgvm.ops.kernels import conv_im2col as ci
    from cgvm.ops.conv_geometry import ConvGeometry, dims_product
    from cgvm.ops.kernels.scratch import layout_bytes

    x, w = r(*cfg["x"]), r(*cfg["w"])
    nsp = x.ndim - 2
    stride, pad, groups = spatial(cfg["stride"], nsp), cfg["pad"], cfg.get("groups", 1)
    geo = ConvGeometry(nsp, stride, spatial(pad, nsp) if isinstance(pad, int) else pad, (1,) * nsp, groups)
    g = r(*ref_conv(x, w, None, stride=cfg["stride"], pad=pad, groups=groups).shape)
    assert ci.per_sample_weight_products(w.shape[0] // groups, int(np.prod(w.shape[1:])), dims_product(g.shape[2:]))
    assert not ci.batch_last.batch_last_pays(x.shape, g.shape[2:], "weight")
    want = ref_conv_grad_weight(x, g, w.shape[2:], stride=cfg["stride"], pad=pad, groups=groups)
    for budget in (ci.COLUMN_BUDGET_BYTES, 1):
        monkeypatch.setattr(ci, "COLUMN_BUDGET_BYTES", budget)
        scratch = np.empty(layout_bytes(ci.backward_weight_layout(x.shape, g.shape, w.shape[2:], np.float32, geo)),
                           np.uint8)
        got = ci.conv_backward_weight(np, x, g, w.shape[2:], geo, None, scratch)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- kernels honour `out`

def test_kernels_write_into_out():
    x, w, b = r(2, 3, 6, 6), r(4, 3, 3, 3), r(4)
    attrs = dict(stride=(1,), pad=(1,), dilation=(1,), groups=1)
    buf = np.empty((2, 4, 6, 6), np.float32)
    got = CV.conv.bind(np, attrs)(x, w, b, out=buf)
    assert got is buf
    np.testing.assert_allclose(buf, ref_conv(x, w, b, pad=1), rtol=1e-4, atol=1e-5)
    gbuf = np.empty_like(x)
    assert CV.conv_grad_input.bind(np, attrs)(buf, w, x, out=gbuf) is gbuf
    np.testing.assert_allclose(gbuf, ref_conv_grad_input(buf, w, (6, 6), pad=1), rtol=1e-4, atol=1e-4)
    wbuf = np.empty_like(w)
    assert CV.conv_grad_weight.bind(np, attrs)(x, buf, w, out=wbuf) is wbuf
    np.testing.assert_allclose(wbuf, ref_conv_grad_weight(x, buf, (3, 3), pad=1), rtol=1e-4, atol=1e-3)


# --------------------------------------------------------------------------- errors in the user's terms

def test_channel_mismatch_names_user_line():
    x = input_value(TensorType((None, 3, 8, 8), "float32"), "x")
    w = input_value(TensorType((4, 2, 3, 3), "float32"), "w")
    with pytest.raises(ShapeError, match=r"expects 2 input channels.*test_conv\.py"):
        CV.conv(x, w)


def test_bad_attributes_raise():
    x = input_value(TensorType((1, 4, 8, 8), "float32"), "x")
    w = input_value(TensorType((4, 2, 3, 3), "float32"), "w")
    with pytest.raises(ShapeError, match=r"not divisible by groups=3.*test_conv\.py"):
        CV.conv(x, w, groups=3)
    with pytest.raises(ShapeError, match=r"stride has 3 values"):
        CV.conv(x, input_value(TensorType((4, 4, 3, 3), "float32")), stride=(1, 1, 1))
    with pytest.raises(ShapeError, match=r"larger than the padded input"):
        CV.conv(input_value(TensorType((1, 4, 2, 2), "float32")), input_value(TensorType((4, 4, 3, 3), "float32")))
    with pytest.raises(ShapeError, match=r"output_padding"):
        CV.conv_transpose(x, input_value(TensorType((4, 2, 3, 3), "float32")), stride=2, output_padding=2)
    with pytest.raises(GraphBuildError, match=r"no attribute 'padding'"):
        CV.conv(x, input_value(TensorType((4, 4, 3, 3), "float32")), padding=1)


# --------------------------------------------------------------------------- PyTorch, where installed

TORCH_CONFIGS = [
    dict(nsp=1, x=(2, 4, 11), w=(6, 2, 3), stride=2, pad=1, dilation=1, groups=2),
    dict(nsp=2, x=(2, 3, 9, 8), w=(5, 3, 3, 2), stride=(2, 1), pad=(1, 0), dilation=(1, 2), groups=1),
    dict(nsp=2, x=(1, 4, 7, 7), w=(8, 1, 3, 3), stride=1, pad=1, dilation=1, groups=4),
    dict(nsp=3, x=(1, 2, 4, 5, 6), w=(3, 2, 2, 3, 2), stride=(1, 2, 1), pad=1, dilation=1, groups=1),
]


@pytest.mark.parametrize("cfg", TORCH_CONFIGS, ids=lambda c: f"conv{c['nsp']}d")
def test_against_torch(cfg):
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    x = rng.standard_normal(cfg["x"])
    w = rng.standard_normal(cfg["w"])
    attrs = {k: cfg[k] for k in ("stride", "pad", "dilation", "groups")}
    torch_conv = getattr(functional, f"conv{cfg['nsp']}d")
    torch_deconv = getattr(functional, f"conv_transpose{cfg['nsp']}d")
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    ty = torch_conv(tx, tw, stride=cfg["stride"], padding=cfg["pad"], dilation=cfg["dilation"], groups=cfg["groups"])
    seed = rng.standard_normal(tuple(ty.shape))
    ty.backward(torch.tensor(seed))
    # conv_transpose maps ty's shape back: weight (C_in=O, C_out/groups, k...) is conv's own weight
    tz = torch_deconv(torch.tensor(seed), torch.tensor(w), stride=cfg["stride"], padding=cfg["pad"],
                      dilation=cfg["dilation"], groups=cfg["groups"])

    xs = input_value(TensorType(x.shape, "float64"), "x")
    ws = input_value(TensorType(w.shape, "float64"), "w")
    ss = input_value(TensorType(seed.shape, "float64"), "seed")
    y = CV.conv(xs, ws, **attrs)
    gx, gw = cgvm.grad(R.sum(E.mul(y, ss)), [xs, ws])
    z = CV.conv_transpose(ss, ws, **attrs)
    got = cgvm.compile([xs, ws, ss], [y, gx, gw, z])(x, w, seed)
    for mine, theirs in zip(got, [ty, tx.grad, tw.grad, tz]):
        np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=1e-9, atol=1e-9)


def test_deconv_output_padding_against_torch():
    torch = pytest.importorskip("torch")
    x, w, b = rng.standard_normal((2, 4, 3, 5)), rng.standard_normal((4, 3, 3, 2)), rng.standard_normal(6)
    attrs = dict(stride=(2, 3), pad=(1, 0), dilation=(1, 2), groups=2, output_padding=(1, 2))
    want = torch.nn.functional.conv_transpose2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), stride=(2, 3),
                                                padding=(1, 0), dilation=(1, 2), groups=2, output_padding=(1, 2))
    got = _run(lambda *v: CV.conv_transpose(*v, **attrs), x, w, b)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-9, atol=1e-9)


def test_reference_loops_agree_with_each_other():
    # the scatter reference is the adjoint of the gather reference: <conv(x), g> == <x, conv_grad_input(g)>
    x, w = rng.standard_normal((2, 4, 7, 6)), rng.standard_normal((6, 2, 3, 2))
    attrs = dict(stride=(2, 1), pad=(1, 0, 0, 1), dilation=(1, 2), groups=2)
    y = ref_conv(x, w, **attrs)
    g = rng.standard_normal(y.shape)
    lhs = float((y * g).sum())
    assert np.isclose(lhs, float((x * ref_conv_grad_input(g, w, x.shape[2:], **attrs)).sum()))
    assert np.isclose(lhs, float((w * ref_conv_grad_weight(x, g, w.shape[2:], **attrs)).sum()))
