"""Everything Megatron-specific: the patch registry and its records (CPU device shim, create_group
routing, pipeline p2p, control-flow fixes, Megatron-LM hooks), the built-in megatron-core training
entry, and memory accounting. The only package that imports Megatron; nothing imports it back.
"""
