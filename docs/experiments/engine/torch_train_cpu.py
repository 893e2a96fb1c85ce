"""docs/experiments/data/torch_train_bench.py's measurement (the same
models and step), reporting the process's CPU seconds per step
(time.process_time) beside the wall-clock images/s, as `gradsync bench
train --json` does with cpu_seconds_per_step.

    OMP_NUM_THREADS=1 /usr/bin/python3 docs/experiments/engine/torch_train_cpu.py mobilenet 10 5
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "data"))
from torch_train_bench import build  # noqa: E402


def main():
    name, classes, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    torch.set_num_threads(1)
    torch.manual_seed(1)
    net = build(name, classes).train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 3, 32, 32)
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
    print(f"torch {name} 3x32x32/{classes} batch 64 threads 1: {steps} steps, "
          f"{64 * steps / sec:.1f} images/s, {cpu / steps:.3f} CPU s/step")


if __name__ == "__main__":
    main()
