"""Megatron-specific code that is not a patch, by concept:

* `job`: Megatron-LM's flags and the production configurations (`launch/configs/*.args`) read into
  the target job;
* `entry`: the built-in megatron-core training entry (`prism_megatron.launch builtin`);
* `plan`: the full-size memory planner (`prism-megatron plan`);
* `run`: one real process's run plumbing: the virtual world, the runtime that applies the patches,
  memory and collective measurement, per-rank results, Megatron-LM's script runner.

Nothing below this floor (topology, backend, replay, graph, sim, network, report) imports it.
"""
