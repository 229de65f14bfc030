"""The GPU rows' PyTorch side: the benchmark nets (benchmarks/nets.py) in torch.nn.functional, CUDA eager,
reading the same weights as cgvm's workspace (copied, so torch's updates are its own)."""
from __future__ import annotations

from typing import Any, Callable, Dict, Sequence

from . import nets


def weights(torch: Any, net: nets.Net, grad: bool = False) -> Dict[str, Any]:
    """The net's workspace arrays as CUDA tensors of torch's own (a device-to-device copy each)."""
    out = {}
    for name, value in net.workspace.items():
        t = torch.from_dlpack(value).clone() if hasattr(value, "__dlpack__") else torch.as_tensor(value).cuda()
        if grad and t.is_floating_point() and any(p.name == name for p in net.params):
            t.requires_grad_(True)
        out[name] = t
    return out


def _bn(F: Any, W: Dict[str, Any], name: str, h: Any, train: bool) -> Any:
    if train:   # batch statistics, as cgvm's batch_norm(training=True); running stats not tracked
        return F.batch_norm(h, None, None, W[f"{name}/scale"], W[f"{name}/bias"], training=True, eps=1e-5)
    return F.batch_norm(h, W[f"{name}/mean"], W[f"{name}/var"], W[f"{name}/scale"], W[f"{name}/bias"],
                        training=False, eps=1e-5)


def resnet50(torch: Any, W: Dict[str, Any], train: bool = False) -> Callable[[Any], Any]:
    """logits(x) of nets.resnet50 with weights ``W``."""
    F = torch.nn.functional

    def forward(x: Any) -> Any:
        h = F.relu(_bn(F, W, "bn1", F.conv2d(x, W["conv1/w"], stride=2, padding=3), train))
        h = F.max_pool2d(h, 3, 2, 1)
        cin = 64
        for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), nets.RESNET50_BLOCKS)):
            cout = 4 * width
            for block in range(blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                name = f"layer{stage + 1}.{block}"
                r = F.relu(_bn(F, W, f"{name}.bn1", F.conv2d(h, W[f"{name}.conv1/w"]), train))
                r = F.relu(_bn(F, W, f"{name}.bn2", F.conv2d(r, W[f"{name}.conv2/w"], stride=stride, padding=1), train))
                r = _bn(F, W, f"{name}.bn3", F.conv2d(r, W[f"{name}.conv3/w"]), train)
                if stride != 1 or cin != cout:
                    h = _bn(F, W, f"{name}.down.bn", F.conv2d(h, W[f"{name}.down/w"], stride=stride), train)
                h = F.relu(r + h)
                cin = cout
        h = F.adaptive_avg_pool2d(h, 1).reshape(-1, 2048)
        return torch.addmm(W["fc/b"], h, W["fc/w"])
    return forward


def alexnet(torch: Any, W: Dict[str, Any]) -> Callable[[Any], Any]:
    """logits(x) of nets.alexnet (inference) with weights ``W``."""
    F = torch.nn.functional

    def conv(h: Any, name: str, stride: int = 1, pad: int = 0, groups: int = 1) -> Any:
        return F.relu(F.conv2d(h, W[f"{name}/w"], W[f"{name}/b"], stride=stride, padding=pad, groups=groups))

    def lrn(h: Any) -> Any:
        return F.local_response_norm(h, 5, alpha=1e-4, beta=0.75, k=1.0)

    def forward(x: Any) -> Any:
        h = F.max_pool2d(lrn(conv(x, "conv1", 4)), 3, 2)
        h = F.max_pool2d(lrn(conv(h, "conv2", 1, 2, 2)), 3, 2)
        h = conv(h, "conv3", 1, 1)
        h = conv(h, "conv4", 1, 1, 2)
        h = F.max_pool2d(conv(h, "conv5", 1, 1, 2), 3, 2).reshape(-1, 256 * 6 * 6)
        h = F.relu(torch.addmm(W["fc6/b"], h, W["fc6/w"]))
        h = F.relu(torch.addmm(W["fc7/b"], h, W["fc7/w"]))
        return torch.addmm(W["fc8/b"], h, W["fc8/w"])
    return forward


def sgd_step(torch: Any, logits_of: Callable[[Any], Any], params: Sequence[Any], lr: float) -> Callable[[Any, Any], Any]:
    """``step(x, y) -> loss``: softmax cross entropy, autograd, p -= lr * g (as nets.train_step)."""
    F = torch.nn.functional

    def step(x: Any, y: Any) -> Any:
        loss = F.cross_entropy(logits_of(x), y)
        grads = torch.autograd.grad(loss, list(params))
        with torch.no_grad():
            torch._foreach_add_(list(params), list(grads), alpha=-lr)
        return loss
    return step
