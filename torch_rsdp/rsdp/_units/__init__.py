"""RSDP's rotation units (private): ``tp_plan``'s pairs of column- and row-split layers (an
attention block, an MLP) whose shards travel in one buffer (:mod:`.rotation_unit`), their
planning (:mod:`.tp_plan`), the call they run (:mod:`.unit_call`), per-layer and whole-unit
paths (:mod:`.unit_layers`, :mod:`.unit_whole`) and unit blocks (:mod:`.unit_block`).

May import: the layers (``.._layers``), the ring core (``.._rotation``), ``torch_rsdp._C``, the
backend's and the neutral modules.
"""
