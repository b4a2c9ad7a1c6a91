"""prism-megatron: emulate a production-scale Megatron-LM job on a few devices.

Importing the package has no side effects: nothing is registered with torch.distributed and
Megatron is not patched until a run activates them explicitly.

``PRISM_NATIVE_DIR``, when set, names a folder whose ``_C`` module is imported before the package's
own: one built for another Python or torch than the checkout's (``make cuda-check`` builds the GPU
machine's outside the package; that machine imports the one carried to it, README "On a GPU").
"""

import os as _os

__version__ = "0.1.0"

if _os.environ.get("PRISM_NATIVE_DIR"):
    __path__.insert(0, _os.path.abspath(_os.environ["PRISM_NATIVE_DIR"]))
