"""A PyTorch Keras-style CNN on MNIST, data-parallel through gradsync's workers.

    gradsync local --workers 2 --entrypoint 'python3 examples/torch_mnist.py --epochs 2'

Each worker starts this script for its rank (RANK, WORLD_SIZE, GRADSYNC_AGENT in its
environment); gradients are averaged over the ranks by gradsync.torch.DistributedOptimizer,
bucket by bucket while backward runs, over the job's ring of workers. Rank 0 reports the
test accuracy, which is the job's result.

The same script runs as a plain torch.distributed DDP script with --ddp (gloo), for a
side-by-side comparison on the same model, data, seed and global batch
(scripts/ddp_vs_gradsync.sh):

    python3 -m torch.distributed.run --standalone --nproc_per_node 2 examples/torch_mnist.py --ddp

(Debian's torch 1.13 under Python 3.11 needs `--redirects 1 --tee 1` there; the comparison
script starts the processes itself.)

Rank 0 ends with one line `torch_mnist result: mode=... test_accuracy=... images_per_second=...`
(images_per_second: every rank's training images per second of training time, evaluation
left out).

The data are the MNIST IDX files gradsync itself reads: the GoMNIST Go module's (found in
the Go module cache) or --data-dir. Needs torch and numpy: Debian's python3-torch. If the
`python3` found first on PATH lacks torch (a pyenv one, say), the script runs itself again
under /usr/bin/python3.
"""

import argparse
import glob
import gzip
import os
import subprocess
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and os.path.exists("/usr/bin/python3"):
        print(f"torch_mnist: {sys.executable} has no torch; running under /usr/bin/python3", file=sys.stderr)
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import gradsync.torch as gs  # noqa: E402

GOMNIST = os.path.join("github.com", "petar", "!go!m!n!i!s!t@*", "data")


def mnist_dir(given):
    if given:
        return given
    roots = []
    for var in ("GOMODCACHE",):
        if os.environ.get(var):
            roots.append(os.environ[var])
    try:
        out = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            roots.append(out.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    gopath = os.environ.get("GOPATH") or os.path.join(os.path.expanduser("~"), "go")
    roots.append(os.path.join(gopath, "pkg", "mod"))
    for r in roots:
        hits = sorted(glob.glob(os.path.join(r, GOMNIST)))
        if hits:
            return hits[-1]
    raise SystemExit("torch_mnist: MNIST not found: give --data-dir (a folder with the four IDX files), "
                     "or have the GoMNIST module in the Go module cache (go mod download in gradsync's checkout)")


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        b = f.read()
    ndim = b[3]
    dims = [int.from_bytes(b[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(b, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(d, split):
    def find(stem):
        for name in (stem, stem + ".gz"):
            if os.path.exists(os.path.join(d, name)):
                return os.path.join(d, name)
        raise SystemExit(f"torch_mnist: {stem}[.gz] not in {d}")
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(find(f"{prefix}-images-idx3-ubyte")).astype(np.float32) / 255.0
    y = read_idx(find(f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
    x = (x - 0.1307) / 0.3081
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)


class Net(nn.Module):
    """Keras' mnist_cnn: conv32-conv64-maxpool-dropout-dense128-dropout-dense10."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.drop1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(9216, 128)
        self.drop2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.drop1(x), 1)
        x = self.drop2(F.relu(self.fc1(x)))
        return self.fc2(x)


def evaluate(model, x, y, device, batch=1000):
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            xb, yb = x[i:i + batch].to(device), y[i:i + batch].to(device)
            out = model(xb)
            loss += float(F.cross_entropy(out, yb, reduction="sum"))
            correct += int((out.argmax(1) == yb).sum())
    model.train()
    return correct / len(x), loss / len(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=128, help="global batch (split over the ranks)")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--device", default="auto", help="auto (cuda when there is one), cpu or cuda")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--checkpoint-every", type=int, default=0,
                    help="gradsync: save the model, optimiser and step into the job's checkpoint store every N "
                         "steps; a script restarted (elastic jobs) or resumed (submit --resume) goes on from the "
                         "newest (0: never)")
    ap.add_argument("--ddp", action="store_true",
                    help="run under torch.distributed (DDP, gloo) instead of gradsync: start it with "
                         "python3 -m torch.distributed.run --nproc_per_node N")
    ap.add_argument("--ddp-powersgd-rank", type=int, default=0,
                    help="with --ddp: PyTorch's powerSGD_hook with this matrix_approximation_rank (0: none); "
                         "under gradsync the job's --compress does this")
    ap.add_argument("--ddp-powersgd-start", type=int, default=10, help="with --ddp: start_powerSGD_iter")
    args = ap.parse_args()

    if args.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        report = _no_report
    else:
        gs.init()
        rank, size = gs.rank(), gs.size()
        report = gs.report
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    d = mnist_dir(args.data_dir)
    xtr, ytr = load(d, "train")
    xte, yte = load(d, "test")
    model = Net().to(device)
    if args.ddp:
        # DDP broadcasts rank 0's parameters at construction and averages the gradients in
        # backward (buckets of 25 MiB); the optimiser is the plain one.
        net = torch.nn.parallel.DistributedDataParallel(model)
        if args.ddp_powersgd_rank > 0:
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
            state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=args.ddp_powersgd_rank,
                                       start_powerSGD_iter=args.ddp_powersgd_start, min_compression_rate=2,
                                       use_error_feedback=True, warm_start=True, random_seed=args.seed)
            net.register_comm_hook(state, psgd.powerSGD_hook)
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        net = model
        gs.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = gs.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=args.lr),
                                      named_parameters=model.named_parameters())
    if args.batch_size % size:
        raise SystemExit(f"torch_mnist: --batch-size {args.batch_size} is not a multiple of the {size} ranks")
    per = args.batch_size // size
    steps_per_epoch = len(xtr) // args.batch_size  # drop the last partial batch, the same on every rank
    total = steps_per_epoch * args.epochs
    if args.max_steps:
        total = min(total, args.max_steps)
    if rank == 0:
        print(f"torch_mnist: {'DDP/gloo' if args.ddp else 'gradsync'}, {size} rank(s), device {device}, "
              f"global batch {args.batch_size}, {total} steps, data {d}", flush=True)
    start = 0
    if not args.ddp and args.checkpoint_every > 0:
        # Every rank gets rank 0's copy of the newest state in the job's store (None at first).
        state = gs.load_checkpoint()
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            start = state["step"]
            if rank == 0:
                print(f"torch_mnist: generation {os.environ.get('GRADSYNC_GENERATION')}: going on from step "
                      f"{start} on {size} rank(s)", flush=True)
    step, seen, train_s, train_cpu = 0, 0, 0.0, 0.0
    for epoch in range(args.epochs):
        if (epoch + 1) * steps_per_epoch <= start:
            step = (epoch + 1) * steps_per_epoch  # trained before the restart
            continue
        # The same permutation on every rank (seed + epoch); rank r takes its slice of each batch.
        perm = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(args.seed + epoch))
        t0, c0 = time.time(), time.process_time()
        for b in range(steps_per_epoch):
            if step >= total:
                break
            if step < start:
                step += 1
                continue
            idx = perm[b * args.batch_size + rank * per: b * args.batch_size + (rank + 1) * per]
            xb, yb = xtr[idx].to(device), ytr[idx].to(device)
            opt.zero_grad()
            loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            opt.step()
            step += 1
            seen += per
            if not args.ddp and args.checkpoint_every > 0 and step % args.checkpoint_every == 0:
                gs.save_checkpoint({"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, step=step)
            if step % args.log_every == 0:
                ips = seen / (train_s + time.time() - t0)
                report(epoch=epoch + 1, step=step, total_steps=total, loss=float(loss), images_per_second=ips,
                          learning_rate=args.lr)
                if rank == 0:
                    print(f"epoch {epoch + 1} step {step}/{total} loss {float(loss):.4f} {ips:.0f} img/s (this rank)",
                          flush=True)
        train_s += time.time() - t0
        train_cpu += time.process_time() - c0
        acc, tl = evaluate(model, xte, yte, device)
        report(eval=True, epoch=epoch + 1, step=step, test_accuracy=acc, test_loss=tl, train_loss=float(loss))
        if rank == 0:
            print(f"epoch {epoch + 1}: test accuracy {100 * acc:.2f}%  test loss {tl:.4f}", flush=True)
        if step >= total:
            break
    ips = seen / train_s
    report(final=True, epoch=epoch + 1, step=step, test_accuracy=acc, test_loss=tl, train_loss=float(loss),
           images_per_second=ips)
    print(f"rank {rank}: done: {step} steps, test accuracy {100 * acc:.2f}%, {ips:.0f} img/s", flush=True)
    if rank == 0:
        print(f"torch_mnist result: mode={'ddp' if args.ddp else 'gradsync'} ranks={size} steps={step} "
              f"global_batch={args.batch_size} test_accuracy={acc:.4f} images_per_second={ips * size:.1f} "
              f"train_seconds={train_s:.2f} train_cpu_seconds={train_cpu:.2f}", flush=True)
    if args.ddp:
        torch.distributed.destroy_process_group()


def _no_report(**fields):
    """gradsync.torch.report's stand-in under DDP: there is no coordinator to report to."""


if __name__ == "__main__":
    main()
