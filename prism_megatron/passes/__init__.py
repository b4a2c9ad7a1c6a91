"""One real process's pass through the run: capture or emulate, inside its virtual world.

The orchestrator (`prism_megatron.emulation`) starts processes; each of them, whatever training
entry it runs, goes through the modules here:

* `world.py`: the virtual world (the default process group of size W whose rank is the process's
  virtual rank, the `prism` backend under it);
* `rank.py`: the capture and emulation passes (`CapturePhase`, `EmulatePhase`): what a process
  records, how it loads its replay schedule, its progress file;
* `closed_loop.py`: the graph simulated inside the process, and the measured compute folded back
  into it after each iteration; `schedule_index.py`: the replay schedule indexed by op;
* `watchdog.py`: the process's guard against a dead launcher or a hung op;
* `memory.py`: the process's memory tracker (live storage on CPU, the allocator on CUDA).

Below `megatron/` and `patches/` (which call into it), above the pure packages it uses; it reads
Megatron only where the virtual world asks megatron-core's parallel state.
"""
