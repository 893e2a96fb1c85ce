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


# name -> (constructor, (C, H, W), mode); inputs kept small where the
# parameter count grows with them.
ARCHS = {
    "mlp": (lambda c, h, w, k: mlp(c, h, w, k), (1, 6, 5), "train"),
    "lenet5": (lambda c, h, w, k: lenet5(c, h, w, k), (1, 28, 28), "train"),
    "cnn": (lambda c, h, w, k: cnn(c, h, w, k), (1, 10, 10), "eval"),
    "fedcnn": (lambda c, h, w, k: fedcnn(c, h, w, k), (1, 12, 12), "train"),
    "resnet8": (lambda c, h, w, k: ResNet8(c, k), (1, 28, 28), "train"),
    "vit-tiny": (lambda c, h, w, k: ViTTiny(c, h, w, k), (1, 28, 28), "train"),
}
CLASSES = 10


def fixture(name, out):
    make, (c, h, w), mode = ARCHS[name]
    torch.manual_seed(sum(map(ord, name)))
    model = make(c, h, w, CLASSES)
    has_bn = any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
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
    labels = torch.randint(0, CLASSES, (BATCH,))
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
        io["grad." + k] = p.grad
    if has_bn:
        for k, v in model.state_dict().items():
            if "running_" in k:
                io["buffer_after." + k] = v
    meta = {"mode": mode, "input": f"{c}x{h}x{w}", "torch": torch.__version__}
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
