"""Tests of the Python side of the agent's bell (gradsync.client._Bell) against a scripted
worker side: replies out of order, errors under their numbers, waits and callbacks mixed, a
connection that ends. The worker's side is tested in agent/bell_test.go; the two together in
test_gradsync.py (every shared-memory all-reduce of a script goes through the bell)."""

import os
import socket
import struct
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE)))

try:
    import grpc  # noqa: F401  (gradsync.client needs it)
    from gradsync import client
except ImportError as e:  # pragma: no cover
    client = None
    MISSING = str(e)

REQ = struct.Struct("<IHHqqq")
MAGIC = 0x31425347


def reply(seq, code=0, msg=b""):
    return struct.pack("<IIqII", MAGIC, code, seq, len(msg), 0) + msg


@unittest.skipIf(client is None, "bell tests skipped: gradsync.client does not import (python3-grpcio)")
class TestBell(unittest.TestCase):
    def setUp(self):
        d = tempfile.mkdtemp(prefix="gradsync-bell-")
        self.path = os.path.join(d, "agent.bell")
        self.lis = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lis.bind(self.path)
        self.lis.listen(1)
        self.conn = None
        self.accepted = threading.Event()

        def accept():
            self.conn, _ = self.lis.accept()
            self.accepted.set()
        threading.Thread(target=accept, daemon=True).start()
        self.bell = client._Bell(self.path, timeout=30)
        self.assertTrue(self.accepted.wait(30))

    def tearDown(self):
        self.bell.close()
        if self.conn is not None:
            self.conn.close()
        self.lis.close()

    def requests(self, n):
        """Reads n request frames from the client."""
        out, buf = [], b""
        while len(out) < n:
            while len(buf) < REQ.size:
                buf += self.conn.recv(4096)
            magic, op, flags, seq, off, length = REQ.unpack(buf[:REQ.size])
            buf = buf[REQ.size:]
            self.assertEqual((magic, op), (MAGIC, 1))
            out.append((seq, off, length, flags))
        return out

    def test_out_of_order_and_errors(self):
        for seq in (0, 1, 2):
            self.bell.send(seq, 10 * seq, 5, average=(seq != 1))
        self.assertEqual(self.requests(3), [(0, 0, 5, 1), (1, 10, 5, 0), (2, 20, 5, 1)])
        # 2 ends first, then 1 fails, then 0.
        self.conn.sendall(reply(2) + reply(1, grpc.StatusCode.INVALID_ARGUMENT.value[0], b"outside the region")
                          + reply(0))
        self.assertIsNone(client._BellFuture(self.bell, 0).result())
        self.assertIsNone(client._BellFuture(self.bell, 2).result())
        with self.assertRaises(client.AgentError) as e:
            client._BellFuture(self.bell, 1).result()
        self.assertIn("INVALID_ARGUMENT", str(e.exception))
        self.assertIn("outside the region", str(e.exception))

    def test_callbacks_then_waits(self):
        # A callback starts the reader thread; a later plain wait is served by it too.
        got = threading.Event()
        self.bell.send(0, 0, 1, True)
        self.bell.send(1, 1, 1, True)
        client._BellFuture(self.bell, 0).add_done_callback(lambda f: got.set())
        self.requests(2)
        self.conn.sendall(reply(0))
        self.assertTrue(got.wait(30))
        res = {}

        def wait1():
            res["r"] = client._BellFuture(self.bell, 1).result()
        t = threading.Thread(target=wait1)
        t.start()
        self.conn.sendall(reply(1))
        t.join(30)
        self.assertFalse(t.is_alive(), "a wait after the reader thread started never ended")
        self.assertIsNone(res["r"])

    def test_concurrent_waiters(self):
        # Two threads wait for different numbers; the replies come in reverse order.
        for seq in range(4):
            self.bell.send(seq, seq, 1, True)
        self.requests(4)
        errs = []

        def wait(seq):
            try:
                client._BellFuture(self.bell, seq).result()
            except Exception as e:  # noqa: BLE001
                errs.append(e)
        ts = [threading.Thread(target=wait, args=(s,)) for s in range(4)]
        for t in ts:
            t.start()
        self.conn.sendall(b"".join(reply(s) for s in (3, 2, 1, 0)))
        for t in ts:
            t.join(30)
            self.assertFalse(t.is_alive())
        self.assertEqual(errs, [])

    def test_worker_gone(self):
        self.bell.send(0, 0, 1, True)
        self.requests(1)
        self.conn.close()
        with self.assertRaises(client.AgentError) as e:
            client._BellFuture(self.bell, 0).result()
        self.assertIn("UNAVAILABLE", str(e.exception))


if __name__ == "__main__":
    unittest.main()
