"""Independent references for the Caffe fork layers: plain loops written from the SSD fork's
formulas (PriorBox, DetectionOutput, Normalize) and a PyTorch walk over a whole net."""
from __future__ import annotations

import math

import numpy as np


def prior_box_loops(min_sizes, max_sizes, ratios_given, flip, clip, variances, layer_hw, image_hw,
                    step=None, offset=0.5):
    """The PriorBox top, element by element as the fork's forward loop writes it."""
    ratios = [1.0]
    for ar in ratios_given:
        if all(abs(ar - r) >= 1e-6 for r in ratios):
            ratios.append(ar)
            if flip:
                ratios.append(1.0 / ar)
    h_layer, w_layer = layer_hw
    img_h, img_w = image_hw
    step_h = step if step else img_h / h_layer
    step_w = step if step else img_w / w_layer
    out = []
    for h in range(h_layer):
        for w in range(w_layer):
            cx, cy = (w + offset) * step_w, (h + offset) * step_h
            for s, mn in enumerate(min_sizes):
                mn = int(mn)
                boxes = [(mn, mn)]
                if max_sizes:
                    side = math.sqrt(mn * int(max_sizes[s]))
                    boxes.append((side, side))
                for ar in ratios:
                    if abs(ar - 1.0) < 1e-6:
                        continue
                    boxes.append((mn * math.sqrt(ar), mn / math.sqrt(ar)))
                for bw, bh in boxes:
                    out += [(cx - bw / 2) / img_w, (cy - bh / 2) / img_h, (cx + bw / 2) / img_w, (cy + bh / 2) / img_h]
    if clip:
        out = [min(max(v, 0.0), 1.0) for v in out]
    var = []
    for _ in range(len(out) // 4):
        var += list(variances) if len(variances) == 4 else [variances[0]] * 4
    return np.array([[out, var]], np.float64)


def _iou(a, b):
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return 0.0
    iw, ih = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    area = lambda r: 0.0 if r[2] < r[0] or r[3] < r[1] else (r[2] - r[0]) * (r[3] - r[1])  # noqa: E731
    inter = iw * ih
    return inter / (area(a) + area(b) - inter)


def _decode(prior, var, t, code):
    if code == 1:   # CORNER
        return [prior[k] + var[k] * t[k] for k in range(4)]
    pw, ph = prior[2] - prior[0], prior[3] - prior[1]
    if code == 3:   # CORNER_SIZE
        return [prior[0] + var[0] * t[0] * pw, prior[1] + var[1] * t[1] * ph,
                prior[2] + var[2] * t[2] * pw, prior[3] + var[3] * t[3] * ph]
    cx = var[0] * t[0] * pw + (prior[0] + prior[2]) / 2
    cy = var[1] * t[1] * ph + (prior[1] + prior[3]) / 2
    w, h = math.exp(var[2] * t[2]) * pw, math.exp(var[3] * t[3]) * ph
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def detection_output_loops(loc, conf, prior, num_classes, nms_threshold, top_k, keep_top_k, confidence_threshold,
                           code_type=2, background=0, eta=1.0):
    """Rows [image, label, score, box] as the fork's CPU forward produces them (shared location)."""
    n = loc.shape[0]
    p = prior.shape[2] // 4
    rows = []
    for i in range(n):
        boxes = [_decode(prior[0, 0, 4 * j:4 * j + 4], prior[0, 1, 4 * j:4 * j + 4], loc[i].reshape(-1)[4 * j:4 * j + 4],
                         code_type) for j in range(p)]
        scores = conf[i].reshape(p, num_classes)
        kept = {}
        for c in range(num_classes):
            if c == background:
                continue
            cand = [(float(scores[j, c]), j) for j in range(p) if scores[j, c] > confidence_threshold]
            cand.sort(key=lambda sj: -sj[0])
            if top_k > -1:
                cand = cand[:top_k]
            chosen, thr = [], nms_threshold
            for _, j in cand:
                if all(_iou(boxes[j], boxes[k]) <= thr for k in chosen):
                    chosen.append(j)
                    if eta < 1 and thr > 0.5:
                        thr *= eta
            kept[c] = chosen
        if keep_top_k > -1 and sum(map(len, kept.values())) > keep_top_k:
            pairs = sorted(((float(scores[j, c]), c, j) for c in sorted(kept) for j in kept[c]), key=lambda t: -t[0])
            best = {}
            for _, c, j in pairs[:keep_top_k]:
                best.setdefault(c, []).append(j)
            kept = best
        for c in sorted(kept):
            for j in kept[c]:
                rows.append([i, c, float(scores[j, c])] + list(boxes[j]))
    if not rows:
        return np.array([[[[i] + [-1] * 6 for i in range(n)]]], np.float64)
    return np.array([[rows]], np.float64)


def normalize_numpy(x, scale, across_spatial, eps):
    out = np.empty_like(x, dtype=np.float64)
    for n in range(x.shape[0]):
        item = x[n].astype(np.float64)
        if across_spatial:
            out[n] = item / math.sqrt((item ** 2).sum() + eps)
        else:
            out[n] = item / np.sqrt((item ** 2).sum(axis=0, keepdims=True) + eps)
    s = np.asarray(scale, np.float64)
    return out * (s if s.ndim == 0 else s.reshape((1, -1) + (1,) * (x.ndim - 2)))


def torch_forward(net, data):
    """Every blob of ``net`` recomputed with PyTorch (fork layers with the loops above)."""
    import torch
    import torch.nn.functional as F

    ws = net.workspace
    blobs = {net.inputs[0]: torch.from_numpy(np.asarray(data, np.float64))}
    for info in net.layer_infos:
        p, t = info.param, info.param.type
        xs = [blobs[b] for b in info.bottoms]
        w = [torch.from_numpy(np.array(ws[q.name], np.float64)) for q in info.params]
        if t == "Input":
            continue
        if t == "Convolution":
            c = p.convolution_param
            k = lambda f, d: (getattr(c, f)[0] if len(getattr(c, f)) else d)  # noqa: E731
            y = F.conv2d(xs[0], w[0], w[1] if len(w) > 1 else None, stride=k("stride", 1), padding=k("pad", 0),
                         dilation=k("dilation", 1), groups=c.group)
        elif t == "BatchNorm":
            factor = float(w[2]) and 1.0 / float(w[2])
            y = F.batch_norm(xs[0], w[0] * factor, w[1] * factor, eps=p.batch_norm_param.eps, training=False)
        elif t == "Scale":
            shape = (1, -1, 1, 1)
            y = xs[0] * w[0].reshape(shape) + (w[1].reshape(shape) if len(w) > 1 else 0)
        elif t == "ReLU":
            y = F.leaky_relu(xs[0], p.relu_param.negative_slope)
        elif t == "Pooling":
            c = p.pooling_param
            ceil = c.ceil_mode if c.HasField("ceil_mode") else True
            if c.global_pooling:
                kern, s, pad = tuple(xs[0].shape[2:]), 1, 0
            else:
                kern, s, pad = c.kernel_size, c.stride, c.pad
            pool = F.max_pool2d if c.pool == 0 else (
                lambda *a, **kw: F.avg_pool2d(*a, **kw, count_include_pad=True))
            y = pool(xs[0], kern, s, pad, ceil_mode=ceil)
        elif t == "Concat":
            y = torch.cat(xs, dim=p.concat_param.axis)
        elif t == "Split":
            for top in info.tops:
                blobs[top] = xs[0]
            continue
        elif t == "Permute":
            order = list(p.permute_param.order)
            y = xs[0].permute(order + [a for a in range(xs[0].ndim) if a not in order]).contiguous()
        elif t == "Flatten":
            y = xs[0].reshape(xs[0].shape[0], -1)
        elif t == "Reshape":
            dims = [xs[0].shape[i] if d == 0 else d for i, d in enumerate(p.reshape_param.shape.dim)]
            y = xs[0].reshape(dims)
        elif t == "Softmax":
            y = F.softmax(xs[0], dim=p.softmax_param.axis)
        elif t == "Normalize":
            c = p.norm_param
            y = torch.from_numpy(normalize_numpy(xs[0].numpy(), w[0].numpy(), c.across_spatial, c.eps))
        elif t == "PriorBox":
            c = p.prior_box_param
            y = torch.from_numpy(prior_box_loops(
                list(c.min_size), list(c.max_size), list(c.aspect_ratio), c.flip, c.clip, list(c.variance) or [0.1],
                tuple(xs[0].shape[2:]), (c.img_h, c.img_w) if c.img_h else tuple(xs[1].shape[2:]),
                step=c.step if c.HasField("step") else None, offset=c.offset))
        elif t == "DetectionOutput":
            c = p.detection_output_param
            y = torch.from_numpy(detection_output_loops(
                xs[0].numpy(), xs[1].numpy(), xs[2].numpy(), c.num_classes, c.nms_param.nms_threshold,
                c.nms_param.top_k if c.nms_param.HasField("top_k") else -1, c.keep_top_k,
                c.confidence_threshold if c.HasField("confidence_threshold") else -3.4e38, c.code_type,
                c.background_label_id))
        else:
            raise AssertionError(f"the reference has no {t}")
        blobs[info.tops[0]] = y
    return {k: v.numpy() for k, v in blobs.items()}


def detection_inputs(seed, n=2, priors=60, classes=4, peaky=3.0):
    """(loc, conf, prior) for DetectionOutput: random priors with SSD's variances, softmaxed scores."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.1, 0.9, size=(priors, 2))
    sizes = rng.uniform(0.05, 0.4, size=(priors, 2))
    corners = np.concatenate([centres - sizes / 2, centres + sizes / 2], axis=1).reshape(-1)
    prior = np.stack([corners, np.tile([0.1, 0.1, 0.2, 0.2], priors)])[None].astype(np.float32)
    loc = rng.normal(scale=0.5, size=(n, priors * 4)).astype(np.float32)
    logits = rng.normal(scale=peaky, size=(n, priors, classes))
    conf = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return loc, conf.reshape(n, -1).astype(np.float32), prior
