"""Every change prism makes to Megatron or to torch at run time, and nothing else.

`registry` applies and undoes the records; `catalog` lists every record (`--prism-list-patches`, the
drift tests). One module per patched Megatron module or concern:

* `parallel_state`: `create_group` routes Megatron's groups into the virtual world and logs them;
* `pipeline`, `pipeline_ops`: the P2PCommunicator subclass the schedules use;
* `arguments`, `training`: Megatron-LM's argument parsing and training loop;
* `cpu_shim`: the CPU device shim for megatron-core;
* `control_flow`: decisions megatron-core takes from a virtual peer's data.

No other module assigns to a Megatron or torch attribute.
"""
