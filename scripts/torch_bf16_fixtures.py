#!/usr/bin/python3
"""Write the bf16 autocast parity fixtures that models/parity_bf16_test.go checks.

usage: /usr/bin/python3 scripts/torch_bf16_fixtures.py [--out models/testdata/parity]

For each architecture with a full state fixture (mlp, lenet5, cnn, resnet8,
vit-tiny) it loads <arch>.state.safetensors and the input batch and labels of
<arch>.io.safetensors (what scripts/torch_fixtures.py wrote), runs one
forward + cross-entropy + backward under torch.autocast("cpu",
dtype=torch.bfloat16) in the fixture's mode, and writes
<arch>.bf16.io.safetensors: logits (as F32), loss and grad.<name> per
parameter (the master weights are float32, so their gradients are too).

PyTorch's CPU autocast runs linear layers and convolutions with bf16 operands
and gives bf16 outputs; gradsync's bf16 keeps float32 outputs (and its first
convolution and attention's inner products in float32), so the Go test
compares each side's distance to the float32 result rather than demanding
equality. Some fixture points are ill-conditioned (a ReLU or max-pool
decision flips when a value moves by bf16's rounding), so the file also
holds, per tensor, floor.<name> (shape []): the largest relative L2 change
of float32's result when the weights and input are perturbed by a random
relative 2^-8 (bf16's unit roundoff), over three draws — the noise floor
any bf16 arithmetic is judged against. Debian's torch 1.13 is assumed: run
with /usr/bin/python3.
"""
import argparse
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_fixtures import ARCHS, CLASSES, write_safetensors  # noqa: E402

BF16_ARCHS = ["mlp", "lenet5", "cnn", "resnet8", "vit-tiny"]
DTYPES = {"F32": (torch.float32, "f", 4), "I64": (torch.int64, "q", 8)}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, h in header.items():
        dtype, fmt, size = DTYPES[h["dtype"]]
        lo, hi = h["data_offsets"]
        vals = struct.unpack("<%d%s" % ((hi - lo) // size, fmt), data[lo:hi])
        out[name] = torch.tensor(vals, dtype=dtype).reshape(h["shape"])
    return out, meta


def rel(a, b):
    return ((a - b).norm() / b.norm()).item() if b.norm() > 0 else (a - b).norm().item()


def perturbed(make, shape, state, mode, x, labels, noise, seed):
    """float32 logits and gradients with weights and input scaled by 1 + U(-noise, noise)."""
    c, h, w = shape
    m = make(c, h, w, CLASSES)
    m.load_state_dict(state, strict=False)
    m.train(mode == "train")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(1 + noise * (torch.rand(p.shape, generator=g) * 2 - 1))
        x = x * (1 + noise * (torch.rand(x.shape, generator=g) * 2 - 1))
    m.zero_grad()
    logits = m(x)
    F.cross_entropy(logits, labels).backward()
    res = {"logits": logits.detach()}
    for k, p in m.named_parameters():
        res["grad." + k] = p.grad.clone()
    return res


def fixture(name, out):
    make, (c, h, w), mode = ARCHS[name][:3]
    model = make(c, h, w, CLASSES)
    state, _ = read_safetensors(os.path.join(out, f"{name}.state.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)  # num_batches_tracked is not saved
    bad = [k for k in missing if not k.endswith("num_batches_tracked")] + list(unexpected)
    if bad:
        raise SystemExit(f"{name}: the state file does not match the module: {bad}")
    io, meta = read_safetensors(os.path.join(out, f"{name}.io.safetensors"))
    x, labels = io["x"], io["labels"]
    model.train(mode == "train")
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits, labels)
    loss.backward()
    res = {"logits": logits.float(), "loss": loss.float().reshape(())}
    for k, p in model.named_parameters():
        res["grad." + k] = p.grad.float()
    ref = perturbed(make, (c, h, w), state, mode, x, labels, 0, 0)
    draws = [perturbed(make, (c, h, w), state, mode, x, labels, 2.0 ** -8, seed) for seed in (1, 2, 3)]
    for k in ref:
        res["floor." + k] = torch.tensor(max(rel(d[k], ref[k]) for d in draws), dtype=torch.float32).reshape(())
    write_safetensors(os.path.join(out, f"{name}.bf16.io.safetensors"), res,
                      {"mode": mode, "input": meta["input"], "torch": torch.__version__, "autocast": "cpu bfloat16"})
    fp32 = io["logits"]
    dev = ((logits.float() - fp32).abs().max() / fp32.abs().max()).item()
    print(f"{name}: loss {loss.item():.6f} (fp32 {io['loss'].item():.6f}), logits' max deviation from fp32 {dev:.2e} of max |logit|")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "models", "testdata", "parity"))
    ap.add_argument("--archs", default=",".join(BF16_ARCHS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in args.archs.split(","):
        fixture(name, args.out)


if __name__ == "__main__":
    main()
