"""PyTorch's side of `gradsync bench train` on CIFAR shapes: images/s of
forward + cross-entropy + backward + SGD(momentum 0.9) steps on random
3x32x32 inputs, batch 64, one thread, after 3 warm-up steps, for the same
architectures as gradsync's resnet18 (torchvision's resnet18 with a 3x3
stem and no max-pool) and mobilenet (scripts/torch_fixtures.py's
MobileNetV1, kuangliu's CIFAR form).

    /usr/bin/python3 docs/experiments/data/torch_train_bench.py resnet18 10 5
    /usr/bin/python3 docs/experiments/data/torch_train_bench.py resnet8 10 5 1x28x28

An optional fourth argument gives the input CxHxW (default 3x32x32);
resnet8 is scripts/torch_fixtures.py's ResNet8 (gradsync's resnet8).
"""
import os
import sys
import time

import torch
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts"))
from torch_fixtures import MobileNet, ResNet8  # noqa: E402


def build(name, classes, c=3):
    if name == "resnet18":
        net = torchvision.models.resnet18(num_classes=classes)
        net.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        net.maxpool = torch.nn.Identity()
        return net
    if name == "mobilenet":
        return MobileNet(c, classes)
    if name == "resnet8":
        return ResNet8(c, classes)
    raise SystemExit(f"unknown model {name}")


def main():
    name, classes, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    c, h, w = map(int, (sys.argv[4] if len(sys.argv) > 4 else "3x32x32").split("x"))
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))  # THREADS=2 for two
    torch.manual_seed(1)
    net = build(name, classes, c).train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, c, h, w)
    y = torch.randint(0, classes, (64,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    start, steps = time.perf_counter(), 0
    while True:
        step()
        steps += 1
        if time.perf_counter() - start >= seconds:
            break
    sec = time.perf_counter() - start
    print(f"torch {name} {c}x{h}x{w}/{classes} batch 64 threads {torch.get_num_threads()}: {steps} steps, {64 * steps / sec:.1f} images/s")


if __name__ == "__main__":
    main()
