"""The traffic theory of the multi-node collectives: torch_rsdp.testing.traffic, shared with the
multinode benchmark suite."""

from torch_rsdp.testing.traffic import *  # noqa: F401,F403
from torch_rsdp.testing.traffic import inter_node_bytes_per_node, tolerance  # noqa: F401
