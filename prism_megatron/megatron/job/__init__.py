"""Megatron-LM's flags, and the configuration files that hold them, read into the target job.

* `target`: the one reading of a job's flags every command shares (topology, plan, emulate, the
  built-in entry): layout, schedule, batch, model shape; `stages`: its pipeline split;
* `flags`, `job`: the memory plan's full flag set (every TransformerConfig field) on top of it, and
  megatron-core's config objects built from it;
* `configs`: production configurations (`launch/configs/*.args`); `size_shrink`: a tiny model of one.
"""
