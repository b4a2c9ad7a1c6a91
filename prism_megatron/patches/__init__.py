"""Every change prism makes to Megatron or to torch at run time, and nothing else.

`registry` applies and undoes the records; `catalog` lists every record (`--prism-list-patches`, the
drift tests). One module per patched Megatron module or concern:

* `parallel_state`: `create_group` routes Megatron's groups into the virtual world and logs them;
* `pipeline`, `pipeline_ops`: the P2PCommunicator subclass the schedules use;
* `arguments`, `training`: Megatron-LM's argument parsing and training loop;
* `cpu_shim`: the CPU device shim for megatron-core;
* `control_flow`: decisions megatron-core takes from a virtual peer's data;
* `model_build`: building megatron-core's models away from CUDA and Transformer Engine (the memory
  plan's meta-device build, the built-in entry's multi-latent attention), and the private optimizer
  function the plan calls.

A record describes a change; a run binds what it needs (`registry.bind`). README.md is the table of
every record, generated from the catalog (`make patches-readme`). No other module assigns to a
Megatron or torch attribute (tests/unit/test_patch_boundary.py).
"""
