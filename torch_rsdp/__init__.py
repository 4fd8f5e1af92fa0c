"""torch_rsdp: the "rsdp" torch.distributed backend.

    import torch_rsdp
    torch.distributed.init_process_group("rsdp")

Importing the package registers the backend (idempotently) for CPU tensors.
"""
from ._registration import BACKEND_NAME, register

__version__ = "0.1.0"

register()

__all__ = ["BACKEND_NAME", "register", "__version__"]
