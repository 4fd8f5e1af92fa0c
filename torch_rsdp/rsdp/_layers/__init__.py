"""RSDP's sharded modules (private): each layer's shard state (:mod:`.shard_state`), the
sharded Linear / ``Conv1D`` / Embedding / MultiheadAttention, and the block gathers that
compute runs of small layers whole (:mod:`.block_gather`, :mod:`.block_copies`).

May import: the ring core (``.._rotation``), ``torch_rsdp._C`` (the native ring schedules),
the backend's and the neutral modules; never the units or what is above them.
"""
