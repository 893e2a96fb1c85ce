"""torchvision's ImageFolder + DataLoader over the same PNG folder as
scripts/loaderbench: one pass over DIR/train in batches of 64, ToTensor +
Normalize, no shuffling, one intra-op thread. Prints images per second.

    /usr/bin/python3 scripts/loaderbench_torch.py /tmp/png32 0   # num_workers=0
    /usr/bin/python3 scripts/loaderbench_torch.py /tmp/png32 1   # num_workers=1
"""
import sys
import time

import torch
import torchvision
import torchvision.transforms as T


def main():
    root, workers = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    tf = T.Compose([T.ToTensor(), T.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])])
    ds = torchvision.datasets.ImageFolder(root + "/train", transform=tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=False, num_workers=workers)
    start = time.perf_counter()
    n = 0
    for x, _ in dl:
        n += x.shape[0]
    sec = time.perf_counter() - start
    print(f"torchvision ImageFolder+DataLoader num_workers={workers}: {n} images {tuple(ds[0][0].shape)} in {sec:.3f} s: {n / sec:.0f} images/s")


if __name__ == "__main__":
    main()
