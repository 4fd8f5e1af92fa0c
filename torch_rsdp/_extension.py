"""Loads the native extension ``torch_rsdp._C``.

Normally that is the build next to this file, found by the import system. ``RSDP_EXTENSION``
names another build of the same sources instead: ``scripts/run_sanitized.sh`` builds one under
AddressSanitizer (or ThreadSanitizer) in its own folder and points this at it, so that any test,
and every rank a test spawns, runs the sanitized code without the normal build being touched.
"""
import importlib.util
import os
import sys

import torch  # noqa: F401  (the extension links against torch's libraries: load them first)

_NAME = "torch_rsdp._C"


def _load(path: str) -> None:
    if not os.path.isfile(path):
        raise ImportError(f"torch_rsdp: RSDP_EXTENSION={path!r} is not a file (unset it to use "
                          "the extension built next to the package)")
    spec = importlib.util.spec_from_file_location(_NAME, path)
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs, as the import system does, so `from . import _C` finds it.
    sys.modules[_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_NAME]
        raise
    # What the import system does for a submodule it loads: the package's attribute.
    setattr(sys.modules[__package__], "_C", module)


if os.environ.get("RSDP_EXTENSION") and _NAME not in sys.modules:
    _load(os.environ["RSDP_EXTENSION"])
