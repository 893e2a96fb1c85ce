#!/usr/bin/python3
"""Write the torchvision adjust_hue fixture that data/jitter_test.go checks.

usage: /usr/bin/python3 scripts/hue_fixture.py [--out data/testdata/adjust_hue.json]

Three float32 RGB images of 3x4x5 (C, H, W) on the [0, 1] scale:

  random   torch.rand from a fixed seed;
  bytes    random bytes / 255, what the loader decodes;
  edges    grays (r = g = b, 0 and 1 among them), ties of the largest
           channel (r = g > b, g = b > r, r = b > g), primaries and
           secondaries, hues near sector boundaries, a nearly gray pixel
           and values of exactly 0 and 1,

each put through torchvision.transforms.functional.adjust_hue (the tensor
path, float32, on the CPU) with each of the fixed hue factors. Values are
written as float(x) of float32 numbers, which JSON keeps exactly.
Debian's torch 1.13 / torchvision 0.14 are assumed: run with /usr/bin/python3.
"""
import argparse
import json

import torch
import torchvision
import torchvision.transforms.functional as TF

FACTORS = [-0.5, -0.3125, -0.05, 0.0, 1e-4, 0.17, 1.0 / 3.0, 0.5]
C, H, W = 3, 4, 5


def edges():
    px = [
        (0, 0, 0), (1, 1, 1), (0.5, 0.5, 0.5), (0.2, 0.2, 0.2),      # grays
        (0.8, 0.8, 0.1), (0.1, 0.7, 0.7), (0.9, 0.3, 0.9),            # ties of the max
        (1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (0, 1, 1), (1, 0, 1),  # primaries, secondaries
        (0.6, 0.6, 0.59999), (1, 0.999, 1),                           # nearly gray, a near tie
        (1, 0.5, 0), (0.25, 1, 0.0), (0.3, 0.2, 0.1),                  # hues at and near boundaries
        (1.0, 1e-7, 0.0), (0.0, 0.2, 0.8),
    ]
    assert len(px) == H * W
    t = torch.tensor(px, dtype=torch.float32)  # (H*W, 3)
    return t.t().reshape(C, H, W).contiguous()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="data/testdata/adjust_hue.json")
    a = ap.parse_args()
    g = torch.Generator().manual_seed(15)
    images = {
        "random": torch.rand(C, H, W, generator=g, dtype=torch.float32),
        "bytes": torch.randint(0, 256, (C, H, W), generator=g).to(torch.float32) / 255.0,
        "edges": edges(),
    }
    cases = []
    for name, img in images.items():
        for f in FACTORS:
            out = TF.adjust_hue(img, f)
            assert out.dtype == torch.float32
            cases.append({
                "image": name,
                "factor": f,
                "output": [float(x) for x in out.flatten().tolist()],
            })
    doc = {
        "comment": "torchvision.transforms.functional.adjust_hue on float32 CxHxW tensors; "
                   "written by scripts/hue_fixture.py",
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "shape": [C, H, W],
        "images": {n: [float(x) for x in img.flatten().tolist()] for n, img in images.items()},
        "cases": cases,
    }
    # One case a line, so that a regenerated fixture diffs readably.
    with open(a.out, "w") as fh:
        head = json.dumps({k: v for k, v in doc.items() if k not in ("images", "cases")})
        fh.write(head[:-1] + ', "images": {\n')
        fh.write(",\n".join(f"{json.dumps(n)}: {json.dumps(v)}" for n, v in doc["images"].items()))
        fh.write('},\n"cases": [\n')
        fh.write(",\n".join(json.dumps(c) for c in cases))
        fh.write("\n]}\n")


if __name__ == "__main__":
    main()
