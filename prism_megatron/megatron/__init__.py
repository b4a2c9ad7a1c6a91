"""Megatron-specific code that is not a patch, by concept:

* `job`: Megatron-LM's flags (declared once) and the production configurations
  (`launch/configs/*.args`) read into the target job (`prism_megatron.target`), and megatron-core's
  configs built from them (`core_config`);
* `entry`: the built-in megatron-core training entry (`prism_megatron.launch builtin`);
* `plan`: the full-size memory planner (`prism-megatron plan`);
* `run`: one real process's lifecycle (`runtime.Runtime`, whose methods are its steps, and the
  `TrainingRecord` of its steps), collective measurement, per-rank results, Megatron-LM's script
  runner;
* `layers`: the local sequence- and context-parallel layers and the layer spec that uses them.

`job` and `layers` sit on the floor of `passes/` (below `patches/`); `entry`, `plan` and `run` above
`patches/` (prism_megatron/README.md). Nothing below (topology, backend, replay, graph, sim,
network, report, target) imports any of it.
"""
