"""Tests of the gradsync Python package against real gradsync workers.

They run `gradsync local` (the binary in $GRADSYNC_BIN, else built with `go build`) with the
scripts next to this file as entrypoints, under this Python. They need torch, grpcio and
protobuf (Debian: python3-torch, python3-grpcio, python3-protobuf) and skip, saying so,
where those are absent.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

MISSING = []
for mod in ("torch", "grpc", "google.protobuf", "numpy"):
    try:
        __import__(mod)
    except ImportError:
        MISSING.append(mod)

_bin = None


def gradsync_bin():
    global _bin
    if _bin is None:
        _bin = os.environ.get("GRADSYNC_BIN")
        if not _bin:
            out = tempfile.mkdtemp(prefix="gradsync-pytest-")
            _bin = os.path.join(out, "gradsync")
            subprocess.run(["go", "build", "-o", _bin, "./cmd/gradsync"], cwd=ROOT, check=True)
    return _bin


def run_local(script, workers=2, extra_env=None, timeout=600, args=()):
    runs = tempfile.mkdtemp(prefix="gradsync-pyruns-")
    env = dict(os.environ)
    env.update(extra_env or {})
    cmd = [gradsync_bin(), "local", "--workers", str(workers), "--runs-dir", runs, "--json",
           "--entrypoint", f"{sys.executable} {os.path.join(HERE, script)}"] + list(args)
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    logs = {}
    for d in os.listdir(runs):
        for f in os.listdir(os.path.join(runs, d)):
            if f.startswith("rank-"):
                with open(os.path.join(runs, d, f)) as fh:
                    logs[f] = fh.read()
    shutil.rmtree(runs, ignore_errors=True)
    return p, logs


@unittest.skipIf(MISSING, "gradsync Python tests skipped: missing " + ", ".join(MISSING) +
                 " (apt-get install python3-torch python3-grpcio python3-protobuf; run with /usr/bin/python3)")
class TestThroughWorkers(unittest.TestCase):

    def test_equivalence_with_full_batch(self):
        # Several buckets and one, through shared memory; several through the socket.
        # The ring between the workers on gRPC, and on shared memory. Mode ps: the
        # coordinator's two summation shards each sum a piece of every bucket.
        for bucket, shm, args in (("0.002", "1", ("--transport", "grpc")), ("4", "1", ("--transport", "grpc")),
                                  ("0.002", "0", ("--transport", "grpc")), ("0.002", "1", ("--transport", "shm")),
                                  ("0.002", "1", ("--mode", "ps", "--ps-shards", "2"))):
            with self.subTest(bucket_mb=bucket, shared_memory=shm, args=" ".join(args)):
                p, logs = run_local("equiv_entry.py", extra_env={"EQUIV_BUCKET_MB": bucket, "EQUIV_SHM": shm},
                                    args=args)
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr + str(logs))
                self.assertIn("SUCCEEDED", p.stdout)
                for r in (0, 1):
                    self.assertIn("EQUIVALENCE OK", logs.get(f"rank-{r}.log", ""), logs)

    def test_ddp_comm_hook(self):
        p, logs = run_local("ddphook_entry.py")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr + str(logs))
        for r in (0, 1):
            self.assertIn("DDPHOOK OK", logs.get(f"rank-{r}.log", ""), logs)

    def test_ddp_comm_hook_compressed(self):
        p, logs = run_local("ddphook_entry.py", extra_env={"DDPHOOK_COMPRESS": "powersgd"},
                            args=("--compress", "powersgd:rank=1,start_iter=3"))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr + str(logs))
        for r in (0, 1):
            self.assertIn("DDPHOOK OK", logs.get(f"rank-{r}.log", ""), logs)
        ratio = [json.loads(line)["compression_ratio"] for line in p.stdout.splitlines()
                 if line.startswith("{") and '"compression_ratio"' in line]
        self.assertTrue(ratio and ratio[-1] > 1.5, "no compression ratio in the result: " + p.stdout)

    def test_broadcast_optimizer_state(self):
        p, logs = run_local("optstate_entry.py")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr + str(logs))
        for r in (0, 1):
            self.assertIn("OPTSTATE OK", logs.get(f"rank-{r}.log", ""), logs)
        self.assertIn("other parameter groups", logs.get("rank-1.log", ""), logs)

    def test_compression(self):
        # PowerSGD from step 3 (then the residuals and warm start carry over), and a cast.
        for spec, typ in (("powersgd:rank=2,start_iter=3", "powersgd"), ("fp16", "fp16")):
            with self.subTest(compress=spec):
                p, logs = run_local("compress_entry.py", extra_env={"COMPRESS_WANT": typ}, args=("--compress", spec))
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr + str(logs))
                self.assertIn("SUCCEEDED", p.stdout)
                for r in (0, 1):
                    self.assertIn("COMPRESS OK", logs.get(f"rank-{r}.log", ""), logs)
                ratio = [json.loads(line)["compression_ratio"] for line in p.stdout.splitlines()
                         if line.startswith("{") and '"compression_ratio"' in line]
                self.assertTrue(ratio and ratio[-1] > 1.5, "no compression ratio in the result: " + p.stdout)

    def test_elastic_restart_after_script_killed(self):
        # 3 workers, at least 2: rank 1's script kills itself (SIGKILL) in generation 1; its
        # worker is evicted and every script restarts on the other two from the saved state.
        with tempfile.TemporaryDirectory() as d:
            job = os.path.join(d, "job.yaml")
            with open(job, "w") as f:
                f.write("workers: 3\nmin_workers: 2\n")
            p, logs = run_local("elastic_entry.py", workers=3, args=("-f", job))
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out + str(logs))
        self.assertIn("SUCCEEDED", out)
        self.assertIn("its command failed (rank 1)", out)
        self.assertIn("killing myself at step 8", str(logs))
        self.assertRegex(logs.get("rank-0.log", ""), r"ELASTIC OK generation=2 size=2 start=(8|9)", logs)

    def test_hung_rank_named(self):
        # Rank 1 stops calling; rank 0's all-reduce fails at the step timeout naming rank 1.
        p, logs = run_local("hang_entry.py", args=("--step-timeout", "3"))
        self.assertNotEqual(p.returncode, 0)
        out = p.stdout + p.stderr
        self.assertIn("FAILED", out)
        self.assertIn("rank 1 (", out)
        self.assertIn("never joined it within the step timeout", out)
        # Rank 1's own worker names it, its idle script and its stderr.
        self.assertRegex(out, r"rank 1 on worker local-\d+ \(.*?\): its script had made no collective call")
        self.assertIn("stopped as hung", out)
        self.assertIn("hanging on purpose", out)
        self.assertIn("hanging on purpose", logs.get("rank-1.log", ""))
        self.assertNotIn("completed", logs.get("rank-0.log", ""))

    def test_crash_names_rank_and_stderr(self):
        p, logs = run_local("crash_entry.py")
        self.assertNotEqual(p.returncode, 0)
        out = p.stdout + p.stderr
        self.assertIn("FAILED", out)
        self.assertIn("rank 1", out)
        self.assertIn("boom on purpose", out)  # the last stderr lines
        self.assertIn("boom on purpose", logs.get("rank-1.log", ""))


    def test_federated_clients(self):
        # 3 script clients (gradsync.fl) holding 40, 80 and 120 examples, 4 rounds; client 2's
        # script crashes in round 3: it leaves, named with its stderr, and the job goes on.
        import numpy as np
        with tempfile.TemporaryDirectory() as d:
            p, logs = run_local("fl_entry.py", workers=3, extra_env={
                "FL_DUMP_DIR": d, "FL_CRASH_CLIENT": "2", "FL_CRASH_ROUND": "3"},
                args=("--mode", "fedavg", "--fraction", "1", "--rounds", "4", "--lr", "0.1", "--local-batch", "20"))
            out = p.stdout + p.stderr
            self.assertEqual(p.returncode, 0, out + str(logs))
            self.assertIn("SUCCEEDED", out)
            self.assertIn("(client 2) lost: its client left", out)
            self.assertIn("crash on purpose in round 3", out)
            files = set(os.listdir(d))
            acc = {}
            for rnd in range(1, 5):
                ev = np.load(os.path.join(d, f"eval-{rnd}.npz"))
                acc[rnd] = float(ev["acc"])
                glob = [ev[f"arr_{i}"] for i in range(len(ev.files) - 1)]
                fits = [np.load(os.path.join(d, f"fit-{rnd}-{k}.npz")) for k in range(3) if f"fit-{rnd}-{k}.npz" in files]
                self.assertEqual(len(fits), 3 if rnd < 3 else 2, f"round {rnd}: {sorted(files)}")
                P = len(glob)
                total = sum(int(f["n"]) for f in fits)
                for i in range(P):
                    start = fits[0][f"arr_{i}"]
                    for f in fits:  # every client trained from the same global model
                        np.testing.assert_array_equal(f[f"arr_{i}"], start)
                    # FedAvg: the global model moves by the num_examples-weighted mean of the deltas.
                    want = start + sum(int(f["n"]) * (f[f"arr_{P + i}"] - start) for f in fits) / total
                    np.testing.assert_allclose(glob[i], want, rtol=0, atol=2e-6,
                                               err_msg=f"round {rnd}, parameter {i}: not the weighted average")
                if rnd < 4:  # the next round starts from this global model
                    nxt = np.load(os.path.join(d, f"fit-{rnd + 1}-0.npz"))
                    for i in range(P):
                        np.testing.assert_array_equal(nxt[f"arr_{i}"], glob[i])
        self.assertGreater(acc[4], acc[1], acc)
        self.assertGreater(acc[4], 0.75, acc)


if __name__ == "__main__":
    unittest.main(verbosity=2)
