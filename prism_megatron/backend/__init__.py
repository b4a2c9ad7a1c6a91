"""The ``prism`` torch.distributed backend: one real process plays one rank of a W-rank job.

After :func:`activate`, ``torch.distributed`` is initialised with world size W and rank = this
process's virtual rank, on the C++ backend ``prism`` (``csrc/backend/``). ``new_group(ranks)`` and
``new_group(ranks, backend="prism")`` give prism groups; a group that does not contain this process
costs only torch's own bookkeeping (the backend is never asked). Nothing is registered at import.

Semantics of every op (sync and async, functional collectives included):

* **All members real**: the op runs on a real sub-communicator among the real processes (gloo on
  CPU; on CUDA, NCCL when the group's real members have distinct GPUs, gloo on the CUDA tensors
  when two share one, since NCCL refuses a duplicate device: `real_groups.py`); data are exact, as
  that library computes them.
* **Virtual members present**, data policy ``mirror``: a virtual member contributes what its
  *stand-in* contributes: the first real member of the group with the same role (when ``roles`` is
  given), else the real member nearest in group index. With this process the only real member:
  all-reduce sum gives n times the local value, avg the local value, max/min the local value,
  product its n-th power; all-gather copies the input into every slot, except an in-place
  all-gather (the input is this rank's slot of the output, as the distributed optimizer gathers
  parameter shards), where a virtual member's slot keeps what it holds, since each slot is a
  different slice of the model; reduce-scatter gives n times
  the local chunk (avg: the chunk); the all-to-all block received from a virtual member is the local
  block addressed to it (filled from its start, repeated, when sizes differ; zeros when it is
  empty); a broadcast or scatter whose root is virtual, and a recv from a virtual peer, get the data
  of the real member holding the source's role when there is one, otherwise zeros (deterministic
  finite values; uninitialised memory never reaches the program). Mixed groups run the real part
  among the real members and add the virtual contributions, so every real member of a group sees
  the same result.
* **Timing**: an op with virtual members completes at ``max(issue time, the virtual members'
  latest arrival) + cost`` as the replay engine says (:mod:`prism_megatron.replay`); on CPU,
  ``Work.wait()`` returns at that time (C++ sleep then spin, GIL released); a mixed group completes
  at the later of that time and the real part's completion. Ops among real members only are not
  delayed. On a device (CUDA tensors; CPU tensors while the asynchronous test device is active)
  the op completes on the backend's own stream: own arrival is when the device gets to the op,
  the rule is decided there by a wait-until kernel, and ``Work.wait()`` makes the caller's stream
  wait, never the host (`csrc/backend/device_path.cpp`). Read results on the host after
  synchronising, as with NCCL.
* **Safety**: every op is logged with a per-group sequence number (flight recorder:
  :func:`prism_megatron.replay.flight_recorder_dump`, also printed when the process dies of an
  uncaught exception). A wait longer than ``timeout_s`` raises ``DistBackendError`` with the dump.
  With ``check_consistency`` (default), real members that issue different ops, sizes or dtypes at
  the same sequence number of a group get an error naming the group, the sequence number, the ranks
  and both ops (deferred once a pass knows the program matches its graph: checked after the real
  op instead of before it, see :mod:`prism_megatron.backend.consistency`). Errors surface from
  ``wait()``; none is swallowed. On a device a host watchdog
  bounds every op by ``timeout_s`` from its issue and checks the real parts; a failure ends every
  device wait (no GPU hangs) and raises from the next call into the backend.
"""

from prism_megatron.backend.activation import Activation, activate, active, deactivate, is_active

__all__ = ["Activation", "activate", "active", "deactivate", "is_active"]
