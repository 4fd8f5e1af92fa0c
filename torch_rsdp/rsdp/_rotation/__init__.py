"""RSDP's ring core (private): the ring order (:mod:`.ring_order`, ``Ring``), the rotation
schedules (:mod:`.rotation`), error feedback of hops quantised between nodes
(:mod:`.ring_feedback`), the flat layout one shift moves (:mod:`.flat_shard`) and the buffers
it travels in (:mod:`.memory`).

May import: the backend's modules and the neutral ones (``torch_rsdp._utils``...); nothing else
of ``torch_rsdp.rsdp`` (the layers and units build on this floor).
"""
