#!/usr/bin/python3
"""Write the PyTorch parity fixtures that models/parity_test.go checks.

usage: /usr/bin/python3 scripts/torch_fixtures.py [--out models/testdata/parity]

For each architecture it builds the PyTorch module that models.New builds
(same parameter names, shapes and order), initialises it with torch's own
defaults from a fixed seed, and writes two safetensors files:

  <arch>.state.safetensors  the state_dict (parameters and buffers) as F32,
                            without num_batches_tracked: what LoadState reads
  <arch>.io.safetensors     x (batch 4, F32), labels (I64), then for one
                            forward + cross-entropy + backward in the mode
                            named by the metadata key "mode":
                            logits, loss (shape []), grad.<name> per
                            parameter, and for networks with batch norm
                            buffer_after.<name> (the running statistics after
                            the training forward) and logits_eval (an
                            evaluation-mode forward from the saved state,
                            run first).

Batch norm running statistics are randomised before saving so that the
evaluation-mode check is not trivial. The cnn is checked in evaluation mode
(dropout off), since its masks come from different random generators.
Inputs are kept small so the fixtures stay well under a few MB.

Architectures with millions of parameters (resnet18, mobilenet) would
make fixtures of tens of MB, so theirs are compact: no state file; the
weights and buffers are a formula both sides compute exactly (formula_state:
a 32-bit integer hash of the tensor's position in the state_dict and the
element's index, mapped to PyTorch-like ranges), the metadata key "state"
lists every state_dict entry with its shape, and the gradients are
sampled: grad_idx.<name> (I64 element indices), grad.<name> (their values)
and grad_absmax.<name> (max |grad| over the whole tensor, the scale the
tolerance is relative to). The key "arch" names the architecture when the
fixture's name differs (resnet8-rgb: resnet8 on 3x32x32 with 100 classes).

safetensors is written by hand (8-byte little-endian header length, JSON
header, raw little-endian data) because the python package may be absent.
Debian's torch 1.13 is assumed: run with /usr/bin/python3.
"""
import argparse
import collections
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4


def write_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> torch tensor (float32 or int64)."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    blobs = []
    off = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype == torch.float32:
            dtype, fmt = "F32", "<%df"
            vals = t.reshape(-1).tolist()
        elif t.dtype == torch.int64:
            dtype, fmt = "I64", "<%dq"
            vals = t.reshape(-1).tolist()
        else:
            raise ValueError(f"{name}: dtype {t.dtype}")
        blob = struct.pack(fmt % len(vals), *vals)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(blob)]}
        off += len(blob)
        blobs.append(blob)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ------------------------------------------------------------------ models
# Each mirrors the Go architecture of the same name (models/archs.go).

def lenet5(c, h, w, classes):
    # anchors/pytorch/common.py "lenet", for any input size
    h1, w1 = h // 2, w // 2
    h2, w2 = (h1 - 4) // 2, (w1 - 4) // 2
    return nn.Sequential(
        nn.Conv2d(c, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * h2 * w2, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, classes))


def cnn(c, h, w, classes):
    # common.py "kerascnn" with the Keras example's dropouts
    fh, fw = (h - 4) // 2, (w - 4) // 2
    return nn.Sequential(
        nn.Conv2d(c, 32, 3), nn.ReLU(),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Dropout(0.25), nn.Flatten(), nn.Linear(64 * fh * fw, 128), nn.ReLU(),
        nn.Dropout(0.5), nn.Linear(128, classes))


def fedcnn(c, h, w, classes):
    # McMahan et al. 2017's MNIST CNN ("same" padding: 1,663,370 parameters on 1x28x28)
    fh, fw = h // 4, w // 4
    return nn.Sequential(
        nn.Conv2d(c, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * fh * fw, 512), nn.ReLU(),
        nn.Linear(512, classes))


def mlp(c, h, w, classes):
    return nn.Sequential(collections.OrderedDict([
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(c * h * w, 256)), ("relu1", nn.ReLU()),
        ("fc2", nn.Linear(256, 128)), ("relu2", nn.ReLU()),
        ("fc3", nn.Linear(128, classes))]))


class BasicBlock(nn.Module):
    """torchvision's BasicBlock."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        idn = x if self.downsample is None else self.downsample(x)
        return F.relu(out + idn)


class ResNet8(nn.Module):
    def __init__(self, c, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(c, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = nn.Sequential(BasicBlock(16, 16, 1))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, 2))
        self.layer3 = nn.Sequential(BasicBlock(32, 64, 2))
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(x.mean(dim=(2, 3)))


class PatchEmbed(nn.Module):
    def __init__(self, c, d, patch):
        super().__init__()
        self.proj = nn.Conv2d(c, d, patch, patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)  # (N, P, D)


class Block(nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(collections.OrderedDict([
            ("fc1", nn.Linear(d, hidden)), ("act", nn.GELU()), ("fc2", nn.Linear(hidden, d))]))

    def forward(self, x):
        y = self.norm1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ViTTiny(nn.Module):
    def __init__(self, c, h, w, classes, patch=7, d=64, heads=4, depth=2, hidden=128):
        super().__init__()
        self.patch_embed = PatchEmbed(c, d, patch)
        n = (h // patch) * (w // patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + n, d))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.blocks = nn.Sequential(*[Block(d, heads, hidden) for _ in range(depth)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


class SqueezeExcitation(nn.Module):
    """torchvision.ops.SqueezeExcitation(c, hidden): 1x1 convs fc1, fc2."""

    def __init__(self, c, hidden):
        super().__init__()
        self.fc1 = nn.Conv2d(c, hidden, 1)
        self.fc2 = nn.Conv2d(hidden, c, 1)

    def forward(self, x):
        s = x.mean(dim=(2, 3), keepdim=True)
        return x * torch.sigmoid(self.fc2(F.relu(self.fc1(s))))


class SEBasicBlock(BasicBlock):
    """BasicBlock with squeeze-and-excitation after bn2 (SE-ResNet)."""

    def __init__(self, cin, cout, stride, reduction=4):
        super().__init__(cin, cout, stride)
        ds = self.downsample
        del self.downsample  # re-registered after se: state_dict order = Go's
        self.se = SqueezeExcitation(cout, max(1, cout // reduction))
        self.downsample = ds

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.se(self.bn2(self.conv2(out)))
        idn = x if self.downsample is None else self.downsample(x)
        return F.relu(out + idn)


class ResNet(nn.Module):
    """torchvision's ResNet of BasicBlocks in its CIFAR form: 3x3 stride-1
    stem, no max pool."""

    def __init__(self, c, classes, widths, depths, block=BasicBlock):
        super().__init__()
        self.conv1 = nn.Conv2d(c, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        cin = widths[0]
        for i, (w, d) in enumerate(zip(widths, depths)):
            blocks = []
            for j in range(d):
                blocks.append(block(cin, w, 2 if i > 0 and j == 0 else 1))
                cin = w
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.nstages = len(widths)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        for i in range(self.nstages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(x.mean(dim=(2, 3)))


class MobileBlock(nn.Module):
    """kuangliu/pytorch-cifar's MobileNet Block: depthwise 3x3, pointwise 1x1."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False)
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv2 = nn.Conv2d(cin, cout, 1, 1, 0, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(x)))


MOBILENET_CFG = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
                 (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1)]


class MobileNet(nn.Module):
    """MobileNetV1 in kuangliu/pytorch-cifar's CIFAR form, width multiplier
    alpha, global average pool (= its avg_pool2d(2) on 32x32 inputs)."""

    def __init__(self, c, classes, alpha=1.0):
        super().__init__()
        width = lambda n: max(1, int(round(n * alpha)))  # noqa: E731 (halves are not hit)
        cin = width(32)
        self.conv1 = nn.Conv2d(c, cin, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cin)
        blocks = []
        for out, stride in MOBILENET_CFG:
            blocks.append(MobileBlock(cin, width(out), stride))
            cin = width(out)
        self.layers = nn.Sequential(*blocks)
        self.linear = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.linear(x.mean(dim=(2, 3)))


class ConvViT(nn.Module):
    """A convolutional stem (two 3x3 stride-2 conv + BN + ReLU) feeding
    ViTTiny's blocks; mean pooling over tokens after the final norm."""

    def __init__(self, c, h, w, classes, d=64, heads=4, depth=2, hidden=128):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(c, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, d, 3, 2, 1, bias=False), nn.BatchNorm2d(d), nn.ReLU())
        for _ in range(2):
            h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        self.pos_embed = nn.Parameter(torch.zeros(1, h * w, d))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.blocks = nn.Sequential(*[Block(d, heads, hidden) for _ in range(depth)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1))


def fmix32(h):
    """murmur3's 32-bit finaliser on a uint64 array of values < 2**32."""
    m = np.uint64(0xFFFFFFFF)
    h = h ^ (h >> np.uint64(16))
    h = (h * np.uint64(0x85EBCA6B)) & m
    h = h ^ (h >> np.uint64(13))
    h = (h * np.uint64(0xC2B2AE35)) & m
    return h ^ (h >> np.uint64(16))


def formula_values(name, shape, t):
    """The values of state_dict entry t (0-based, in state_dict order):
    u = fmix32((i + 0x9E3779B9*(t+1)) mod 2**32) / 2**32 for element i,
    mapped by the entry's kind; float64 arithmetic, then rounded to
    float32. models/parity_test.go computes the same, bit for bit."""
    n = int(np.prod(shape)) if len(shape) else 1
    i = np.arange(n, dtype=np.uint64)
    a = (i + np.uint64((0x9E3779B9 * (t + 1)) & 0xFFFFFFFF)) & np.uint64(0xFFFFFFFF)
    u = fmix32(a).astype(np.float64) / 2.0 ** 32
    if name.endswith("running_mean"):
        v = 0.5 * (2 * u - 1)
    elif name.endswith("running_var"):
        v = 0.5 + 1.5 * u
    elif len(shape) == 1 and name.endswith(".weight"):  # batch norm's gamma
        v = 0.5 + u
    elif name.endswith(".bias"):
        v = 0.2 * (2 * u - 1)
    else:
        v = (1 / math.sqrt(int(np.prod(shape[1:])))) * (2 * u - 1)
    return torch.from_numpy(v.astype(np.float32).reshape(shape))


def formula_state(model):
    """Sets every parameter and buffer (but num_batches_tracked) of model
    from formula_values and returns [[name, shape], ...] in state order."""
    entries = []
    with torch.no_grad():
        state = model.state_dict(keep_vars=True)
        t = 0
        for k, v in state.items():
            if k.endswith("num_batches_tracked"):
                continue
            v.copy_(formula_values(k, list(v.shape), t))
            entries.append([k, list(v.shape)])
            t += 1
    return entries


def sample_indices(n, k=256):
    """k element indices of a tensor of n, spread by a large odd stride,
    with the first and last."""
    if n <= k:
        return list(range(n))
    return sorted({(j * 1000003) % n for j in range(k)} | {0, n - 1})


# mobilenet (alpha 1) is checked in evaluation mode: in training mode its
# 27 batch norms over a batch of 4 make the gradients ill-conditioned —
# torch's own float32 gradients differ from its float64 ones by more than
# the tolerance (bn1.weight: 0.4633 vs 0.4625, 1.7e-3 of max |grad|) — so
# batch statistics are checked on mobilenet-0.5 (and the resnets) instead.
# resnet18 is checked at 3x16x16: at 8x8 its layer4 normalises over
# batch 4 x 1 x 1 = 4 values per channel, and there rounding differences of
# 1e-6 in one GEMM (OpenBLAS's SkylakeX kernels against Haswell's) moved
# its gradients by 1 % of max |grad|; at 16x16 (2x2 in layer4) they agree.
# name -> (constructor, (C, H, W), mode[, options]); inputs kept small
# where the parameter count grows with them. options: "arch" (the Go
# architecture when it is not the fixture's name), "classes" (default
# CLASSES), "compact" (formula weights and sampled gradients).
ARCHS = {
    "mlp": (lambda c, h, w, k: mlp(c, h, w, k), (1, 6, 5), "train"),
    "lenet5": (lambda c, h, w, k: lenet5(c, h, w, k), (1, 28, 28), "train"),
    "cnn": (lambda c, h, w, k: cnn(c, h, w, k), (1, 10, 10), "eval"),
    "fedcnn": (lambda c, h, w, k: fedcnn(c, h, w, k), (1, 12, 12), "train"),
    "resnet8": (lambda c, h, w, k: ResNet8(c, k), (1, 28, 28), "train"),
    "vit-tiny": (lambda c, h, w, k: ViTTiny(c, h, w, k), (1, 28, 28), "train"),
    "resnet8-rgb": (lambda c, h, w, k: ResNet8(c, k), (3, 32, 32), "train", {"arch": "resnet8", "classes": 100}),
    "se-resnet8": (lambda c, h, w, k: ResNet(c, k, [16, 32, 64], [1, 1, 1], SEBasicBlock), (3, 16, 16), "train"),
    "convvit": (lambda c, h, w, k: ConvViT(c, h, w, k), (3, 16, 16), "train"),
    "resnet18": (lambda c, h, w, k: ResNet(c, k, [64, 128, 256, 512], [2, 2, 2, 2]), (3, 16, 16), "train", {"compact": True}),
    "mobilenet": (lambda c, h, w, k: MobileNet(c, k), (3, 32, 32), "eval", {"compact": True}),
    "mobilenet-0.5": (lambda c, h, w, k: MobileNet(c, k, 0.5), (3, 32, 32), "train", {"compact": True}),
}
CLASSES = 10


def fixture(name, out):
    make, (c, h, w), mode = ARCHS[name][:3]
    opts = ARCHS[name][3] if len(ARCHS[name]) > 3 else {}
    classes = opts.get("classes", CLASSES)
    compact = opts.get("compact", False)
    torch.manual_seed(sum(map(ord, name)))
    model = make(c, h, w, classes)
    has_bn = any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    meta = {"mode": mode, "input": f"{c}x{h}x{w}", "torch": torch.__version__}
    if "arch" in opts:
        meta["arch"] = opts["arch"]
    if classes != CLASSES:
        meta["classes"] = str(classes)
    if compact:
        meta["state"] = json.dumps(formula_state(model), separators=(",", ":"))
    else:
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                # non-trivial affine parameters and running statistics
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.uniform_(-0.2, 0.2)
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
        state = {k: v.clone() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
        write_safetensors(os.path.join(out, f"{name}.state.safetensors"), state, {"format": "pt"})

    x = torch.randn(BATCH, c, h, w)
    labels = torch.randint(0, classes, (BATCH,))
    io = {"x": x, "labels": labels}
    if has_bn:
        model.eval()
        with torch.no_grad():
            io["logits_eval"] = model(x)
    model.train(mode == "train")
    model.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    io["logits"] = logits
    io["loss"] = loss.reshape(())
    for k, p in model.named_parameters():
        if compact:
            g = p.grad.reshape(-1)
            idx = torch.tensor(sample_indices(g.numel()), dtype=torch.int64)
            io["grad_idx." + k] = idx
            io["grad." + k] = g[idx]
            io["grad_absmax." + k] = g.abs().max().reshape(())
        else:
            io["grad." + k] = p.grad
    if has_bn:
        for k, v in model.state_dict().items():
            if "running_" in k:
                io["buffer_after." + k] = v
    write_safetensors(os.path.join(out, f"{name}.io.safetensors"), io, meta)
    n = sum(p.numel() for p in model.parameters())
    print(f"{name}: {n} parameters, input {c}x{h}x{w}, mode {mode}, loss {loss.item():.6f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "models", "testdata", "parity"))
    ap.add_argument("--archs", default=",".join(ARCHS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    for name in args.archs.split(","):
        fixture(name, args.out)


if __name__ == "__main__":
    main()
