"""Local (non-Transformer-Engine) layers for what megatron-core's local spec refuses.

megatron-core's local layers cannot run three things a production GPT job uses: sequence
parallelism (its torch norm asserts), context parallelism (its attention asserts) and, through
those, MoE with tensor parallelism. On a machine without Transformer Engine (every CPU) these layers
stand in: `norm.SequenceParallelNorm` for the torch norm, `context_parallel.ContextParallelAttention`
for the attention, with Transformer Engine's communication pattern and exact maths. The built-in
entry puts them in its layer spec (`megatron/layers/parallel_spec.py`); Megatron-LM's own script gets
them from patch records applied on CPU (`prism_megatron.patches.local_layers`). Neither is used where
Transformer Engine builds the layers.
"""
