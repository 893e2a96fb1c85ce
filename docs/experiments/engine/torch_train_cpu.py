"""docs/experiments/data/torch_train_bench.py's measurement (the same
models and step), reporting the process's CPU seconds per step
(time.process_time) beside the wall-clock images/s, as `gradsync bench
train --json` does with cpu_seconds_per_step. An optional fourth argument
is the input CxHxW (default 3x32x32); THREADS sets torch's threads
(default 1); model "cnn" is the Keras MNIST CNN of gradsync's cnn (the
anchors' kerascnn with its dropouts).

    OMP_NUM_THREADS=1 /usr/bin/python3 docs/experiments/engine/torch_train_cpu.py mobilenet 10 5
    OMP_NUM_THREADS=1 /usr/bin/python3 docs/experiments/engine/torch_train_cpu.py resnet8 10 5 1x28x28
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "data"))
from torch_train_bench import build  # noqa: E402


def keras_cnn(c, h, w, classes):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(c, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Dropout(0.25), nn.Flatten(), nn.Linear(64 * ((h - 4) // 2) * ((w - 4) // 2), 128),
        nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, classes))


def main():
    name, classes, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    shape = sys.argv[4] if len(sys.argv) > 4 else "3x32x32"
    c, h, w = map(int, shape.split("x"))
    threads = int(os.environ.get("THREADS", "1"))
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    net = (keras_cnn(c, h, w, classes) if name == "cnn" else build(name, classes, c)).train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, c, h, w)
    y = torch.randint(0, classes, (64,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    start, cpu0, steps = time.perf_counter(), time.process_time(), 0
    while True:
        step()
        steps += 1
        if time.perf_counter() - start >= seconds:
            break
    sec, cpu = time.perf_counter() - start, time.process_time() - cpu0
    print(f"torch {name} {shape}/{classes} batch 64 threads {threads}: {steps} steps, "
          f"{64 * steps / sec:.1f} images/s, {cpu / steps:.3f} CPU s/step")


if __name__ == "__main__":
    main()
