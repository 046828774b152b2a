"""Tensor parallelism over torch.distributed (docs/tensor-parallel.md): process groups
(group.py), the sharded target (shard.py), what the ranks agree on (consensus.py) and the
launcher of ranks on one host (launch.py)."""
