// The `prism` c10d backend: one group of the emulated job, seen from one real process.
//
// Semantics (the Python face, prism_megatron/backend/__init__.py, states them for users):
//   - All members real: the op runs on the real sub-communicator (gloo on CPU, NCCL on CUDA) among
//     the real processes; data are exact.
//   - Virtual members present: data follow the mirror policy (layout.h): a virtual member
//     contributes what its stand-in, a real member of the group, contributes. With this process the
//     only real member: sum gives n times the local value, avg the local value, max/min the local
//     value, product its n-th power; all-gather copies; reduce-scatter gives n times the local chunk;
//     all-to-all's block from a virtual member is the local block addressed to that member; a
//     broadcast, scatter or recv whose source is virtual gets the data of the real member holding the
//     source's role, else zeros. Mixed groups run the real part among the real members and add the
//     virtual members' contributions, so every real member sees the same result.
//   - Timing: an op with virtual members completes at max(issue, the virtual members' latest arrival
//     from the replay engine) + its cost (engine.h); on CPU Work::wait() returns then, spinning in C++.
//     Mixed groups complete at the later of that time and the real part's completion. On CUDA the op
//     runs on the backend's stream, after the issuing stream's prior work, and ends with a wait-until
//     kernel spinning on the GPU timer (own arrival = when that stream gets there); Work::wait() makes
//     the caller's stream wait for it, never the host, as under NCCL.
//   - Each op is logged (op_log.h) with a per-group sequence number. With check_consistency, every
//     collective on a group with two or more real members first all-gathers (kind, bytes, dtype, seq)
//     among them, and a difference raises from wait() naming the group, seq, ranks and both ops.
//   - Errors (real part, divergence from the schedule, timeouts) surface from wait() as
//     DistBackendError with the flight recorder's dump; argument errors raise at issue.
//
// The ops live in one file per family (reduce_ops.cpp, gather_ops.cpp, alltoall_ops.cpp,
// p2p_ops.cpp); each builds an OpPlan and hands it to launch(), the one common path.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/layout.h"
#include "backend/work.h"
#include "replay/device_queue.h"
#include "replay/engine.h"
#include "replay/op_log.h"

namespace prism::backend {

// One op as the common path sees it.
struct OpPlan {
  replay::OpKind kind = replay::OpKind::kAllReduce;
  c10d::OpType op_type = c10d::OpType::UNKNOWN;
  int64_t size_bytes = 0;   // nccl-tests convention: the largest buffer (see OpEvent in replay/)
  at::ScalarType dtype = at::kFloat;
  bool async_op = false;
  int64_t peer_index = -1;  // p2p: the peer's group rank
  // p2p with a real peer: the tensors, the peer's rank on the real sub-communicator and the tag,
  // so the device path can stage the transfer through the host (gloo cannot send CUDA tensors).
  std::vector<at::Tensor> p2p_tensors;
  int64_t real_peer = -1;
  int tag = 0;
  bool size_varies = false; // sizes may legitimately differ across members (all-to-all-v)
  at::Device device = at::kCPU;  // of the op's tensors: device ops complete on the device (device_path.cpp)
  std::vector<at::Tensor> outputs;
  // Issues the real part on the real sub-communicator (only called when the op needs one); may
  // prepare inputs first (pre-scaling, packing).
  std::function<c10::intrusive_ptr<c10d::Work>()> issue_real;
  // The local part: virtual contributions, unpacking, fills. Runs after the real part completes,
  // or at issue when there is no real part.
  std::function<void()> local;
};

struct DeviceState;     // the backend's stream on a device (device_path.cpp)
class RealPartWaiter;  // the backend's helper thread for real parts on a device (device_path.cpp)

// The queue ops on tensors of `device` complete on: CUDA's for CUDA tensors, the test device's for
// CPU tensors while it is active, else null (the op completes on the host, work.cpp).
device::Queue* queue_for(const at::Device& device);
// The first failure of an op on a device (the watchdog's), raised by every later call; null: none.
std::exception_ptr device_failure();
// Forget it and let device waits run again (a new run in the same process: tests).
void clear_device_failure();

class PrismBackend : public c10d::Backend {
 public:
  // The backend of one group, created only after every argument is checked: group_size >= 1 and
  // equal to the number of members, group_rank in [0, group_size), the layout's checks
  // (GroupLayout::checked), and `real` present exactly when the group has two or more real members,
  // with one rank per real member and this process at its real index. real: the sub-communicator
  // among this group's real members (their real index is their rank in it), or null when this
  // process is the group's only real member. Throws std::invalid_argument (ValueError in Python)
  // naming the argument, the value and what is valid.
  static c10::intrusive_ptr<PrismBackend> create(int64_t group_rank, int64_t group_size, std::vector<int64_t> members,
                                                 const std::string& group_name, c10::intrusive_ptr<c10d::Backend> real,
                                                 std::shared_ptr<const BackendContext> ctx);

  // Trusts its arguments (create() checks them); public for make_intrusive.
  PrismBackend(GroupLayout layout, const std::string& group_name, c10::intrusive_ptr<c10d::Backend> real,
               std::shared_ptr<const BackendContext> ctx);

  const std::string getBackendName() const override { return "prism"; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void setTimeout(std::chrono::milliseconds timeout) override;

  const GroupLayout& layout() const { return layout_; }
  const c10::intrusive_ptr<c10d::Backend>& real() const { return real_; }

  // reduce_ops.cpp
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;

  // gather_ops.cpp
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;

  // alltoall_ops.cpp
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;

  // p2p_ops.cpp (and barrier, in backend.cpp)
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  c10::intrusive_ptr<c10d::Work> launch(OpPlan plan);
  // The all-gather of (kind, bytes, dtype, seq) among the real members, its tensors on `device`
  // (the CPU for gloo, the GPU for NCCL), and the check of its result. Deferred
  // (set_consistency_deferred), the check is kept for later and the step returned is already done.
  RealStep consistency_step(const OpPlan& plan, int64_t seq, const at::Device& device);
  // device_path.cpp: a p2p transfer with a real peer on one GPU, staged through pinned host memory.
  c10::intrusive_ptr<c10d::Work> issue_staged_p2p(OpPlan& plan, std::function<void()>& unstage);
  // device_path.cpp; start_mark: the slot the device writes every member's arrival to.
  c10::intrusive_ptr<c10d::Work> launch_on_device(device::Queue* queue, OpPlan plan, WorkSpec spec,
                                                  const replay::Timing& timing, bool has_virtual, bool real_part,
                                                  int64_t start_mark);

  GroupLayout layout_;
  c10::intrusive_ptr<c10d::Backend> real_;
  std::shared_ptr<const BackendContext> ctx_;
  int64_t timeout_ns_;
  std::shared_ptr<replay::OpSlot> slot_;
  std::shared_ptr<const replay::GroupInfo> info_;
  std::shared_ptr<const std::string> ranks_note_;
  int64_t next_seq_ = 0;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
  std::shared_ptr<DeviceState> device_;
  std::shared_ptr<RealPartWaiter> waiter_;
};

// The consistency check among real members, deferred (see launch() in backend.cpp): once the
// program has matched the execution graph, a collective's all-gather of (kind, bytes, dtype, seq)
// is issued after its real part instead of before it (the host path; the device path issues it
// first still, on its own gloo work), nothing waits on it where the op completes, and its result
// is checked later: at a later op's issue once it has completed, and at the latest
// when settle_consistency_checks() runs (between iterations). Every real member of a group must
// switch at the same op (the emulate pass switches all real ranks at one agreed iteration start);
// a mismatch still raises, naming the group, seq, ranks and both ops, only later.
void set_consistency_deferred(bool deferred);
bool consistency_deferred();
// Wait for every deferred check (each at most timeout_ns) and run it; raises the first mismatch.
void settle_consistency_checks(int64_t timeout_ns);

// How the host path waits for a real part (the gloo ops among real members): blocked in gloo's
// wait (default), or polling the op's completion with sched_yield in between. A process with a core
// of its own sees a peer's completion sooner polling (a 4-byte all-reduce between two pinned
// processes, one arriving 2 ms early: p50 0.9 -> 0.4 ms, p90 1.9 -> 0.66 ms); where processes share
// cores it would take the others' CPU, so only the caller that knows its share turns it on.
void set_poll_real_waits(bool poll);
bool poll_real_waits();

// Bytes of a tensor list.
int64_t total_bytes(const std::vector<at::Tensor>& tensors);

// Zeros: the deterministic values a virtual source without a real stand-in sends.
void fill_deterministic(at::Tensor& tensor);

}  // namespace prism::backend

// Every unit that includes this header (the one that allocates the backend, the ones that define
// its methods) records the layout it compiled; module init compares them (abi_probe.h).
PRISM_ABI_PROBE(PrismBackend, ::prism::backend::PrismBackend)
PRISM_ABI_PROBE(OpPlan, ::prism::backend::OpPlan)
