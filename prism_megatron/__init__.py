"""prism-megatron: emulate a production-scale Megatron-LM job on a few devices.

Importing the package has no side effects: nothing is registered with torch.distributed and
Megatron is not patched until a run activates them explicitly.
"""

__version__ = "0.1.0"
