"""Run as an elastic entrypoint job's command (3 workers, at least 2; see test_gradsync.py):
torchrun's contract — a restarted script loads the state it saved. Rank 0 saves the model,
optimiser and step after every step into the job's checkpoint store
(gradsync.torch.save_checkpoint(state, step=N): $GRADSYNC_CHECKPOINT_DIR, the newest 3 kept); in the
first generation rank 1 kills itself with SIGKILL at step 8. gradsync evicts its worker and
restarts every rank's script on the other two (GRADSYNC_GENERATION 2), which load the saved
state and train to step 30. Prints ELASTIC OK with the generation, world size and start step,
and exits 0; exits 1 saying what is wrong."""

import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import gradsync.torch as gs  # noqa: E402
from entry_checks import exit_unless_ranks_agree  # noqa: E402

TOTAL, BATCH, CRASH_AT = 30, 24, 8


def main():
    gs.init()
    rank, size = gs.rank(), gs.size()
    gen = int(os.environ["GRADSYNC_GENERATION"])
    restarts = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if restarts != gen - 1:
        print(f"rank {rank}: TORCHELASTIC_RESTART_COUNT {restarts} at generation {gen}", file=sys.stderr)
        sys.exit(1)
    torch.manual_seed(1)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 4))
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = gs.load_checkpoint()
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        sgd.load_state_dict(state["optim"])
        start = state["step"]
    elif gen > 1:
        print(f"rank {rank}: generation {gen} found no saved state", file=sys.stderr)
        sys.exit(1)
    opt = gs.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(7)
    xs = torch.randn(TOTAL, BATCH, 64, generator=g)
    ys = torch.randint(0, 4, (TOTAL, BATCH), generator=g)
    loss_fn = nn.CrossEntropyLoss()
    per = BATCH // size
    for s in range(start, TOTAL):
        if gen == 1 and rank == 1 and s == CRASH_AT:
            print(f"rank {rank}: killing myself at step {s}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        loss = loss_fn(model(xs[s, rank * per:(rank + 1) * per]), ys[s, rank * per:(rank + 1) * per])
        loss.backward()
        opt.step()
        gs.save_checkpoint({"model": model.state_dict(), "optim": sgd.state_dict(), "step": s + 1}, step=s + 1)
        gs.report(step=s + 1, total_steps=TOTAL, loss=float(loss))
    exit_unless_ranks_agree(model, rank)
    if rank == 0:
        kept = sorted(os.listdir(gs.checkpoint_dir()))
        want = [f"script-step-{n}.pt" for n in (TOTAL - 2, TOTAL - 1, TOTAL)]
        if sorted(kept) != sorted(want):
            print(f"rank 0: the checkpoint store holds {kept}, want {want}", file=sys.stderr)
            sys.exit(1)
    print(f"rank {rank}: ELASTIC OK generation={gen} size={size} start={start}", flush=True)
    gs.report(final=True, step=TOTAL, test_accuracy=0.0)


if __name__ == "__main__":
    main()
