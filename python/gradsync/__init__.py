"""gradsync for PyTorch scripts: talk to the local gradsync worker.

A script started by a gradsync worker for an entrypoint job finds its
worker's agent socket in $GRADSYNC_AGENT. ``gradsync.torch`` (init,
DistributedOptimizer, broadcast_parameters, rank/size, comm_hook for DDP) is the PyTorch API;
``gradsync.client.Agent`` is the raw service, over numpy arrays.
``gradsync.fl`` (Client, start) is for fedavg entrypoint jobs: the script is one federated
client, Flower-style (fit/evaluate over numpy arrays).

Needs grpcio and protobuf (Debian: python3-grpcio, python3-protobuf) and,
for gradsync.torch, torch (python3-torch); gradsync.fl needs numpy, not torch. Importing ``gradsync`` itself
needs nothing beyond the standard library.
"""

__all__ = ["client", "fl", "torch"]
