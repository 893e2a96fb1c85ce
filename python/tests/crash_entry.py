"""An entrypoint that crashes on rank 1 (test_gradsync.py checks the job's error)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gradsync.torch as gs  # noqa: E402

gs.init()
if gs.rank() == 1:
    raise RuntimeError("boom on purpose")
gs.agent().barrier()  # rank 0 waits here until its peer is gone
