// The prism backend's common path: group set-up, launch() (sequence numbers, the replay engine's
// timing, the op log, the consistency check, the real part), coalescing and barrier. The
// collectives themselves are in the *_ops.cpp files.
//
// The consistency check costs a second real op per collective among real members (an all-gather of
// 32 bytes per member), and waited before the real op it put both hand-offs on the op's path: over
// gloo on a loaded host that was 0.3-5 ms per op. It guards the real op from pairing with another
// op, which matters until the program is known to issue what the graph holds; once the emulate pass
// has matched the graph (it compares every iteration), the check is deferred (backend.h).
#include "backend/backend.h"

#include <ATen/core/LegacyTypeDispatch.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "replay/clock.h"
#include "replay/timeline.h"

namespace prism::backend {

namespace {

std::string ranks_note(const GroupLayout& layout, const BackendContext& ctx) {
  std::ostringstream out;
  out << "this process is virtual rank " << ctx.virtual_rank << "; real members: virtual ranks [";
  for (int64_t r = 0; r < layout.num_real(); ++r) {
    out << (r ? ", " : "") << layout.members()[layout.real_positions()[r]];
  }
  out << "]";
  return out.str();
}

// A Work that is complete from the start: the step a deferred consistency check leaves in the op.
class DoneWork : public c10d::Work {
 public:
  DoneWork() { finish(); }
};

// The deferred consistency checks (backend.h), oldest first, of every group of this process.
struct DeferredChecks {
  std::atomic<bool> deferred{false};
  std::mutex mu;
  std::deque<RealStep> pending;
};

DeferredChecks& deferred_checks() {
  static auto* checks = new DeferredChecks();  // never destroyed: works may outlive static destructors
  return *checks;
}

std::string describe_signature(const int64_t* row) {
  std::ostringstream out;
  const auto kind = static_cast<int32_t>(row[0]);
  out << (replay::is_valid_op_kind(kind) ? replay::op_kind_name(static_cast<replay::OpKind>(kind)) : "UNKNOWN");
  if (row[1] >= 0) {
    out << " of " << row[1] << " bytes";
  }
  out << " " << c10::toString(static_cast<at::ScalarType>(row[2]));
  return out.str();
}

}  // namespace

void set_consistency_deferred(bool deferred) { deferred_checks().deferred.store(deferred); }

bool consistency_deferred() { return deferred_checks().deferred.load(); }

void settle_consistency_checks(int64_t timeout_ns) {
  auto& checks = deferred_checks();
  std::deque<RealStep> pending;
  {
    std::lock_guard<std::mutex> lock(checks.mu);
    pending.swap(checks.pending);
  }
  const auto timeout = std::chrono::milliseconds(std::max<int64_t>((timeout_ns + 999'999) / 1'000'000, 1));
  for (auto& step : pending) {
    step.work->wait(timeout);
    step.then();
  }
}

namespace {

// Run the deferred checks whose all-gathers have completed, oldest first, without waiting for any.
void settle_completed_checks() {
  auto& checks = deferred_checks();
  std::vector<RealStep> done;
  {
    std::lock_guard<std::mutex> lock(checks.mu);
    while (!checks.pending.empty() && checks.pending.front().work->isCompleted()) {
      done.push_back(std::move(checks.pending.front()));
      checks.pending.pop_front();
    }
  }
  for (auto& step : done) {
    step.work->wait();  // completed: raises the all-gather's own error, if it failed
    step.then();
  }
}

}  // namespace

int64_t total_bytes(const std::vector<at::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

void fill_deterministic(at::Tensor& tensor) { tensor.zero_(); }

c10::intrusive_ptr<PrismBackend> PrismBackend::create(int64_t group_rank, int64_t group_size,
                                                      std::vector<int64_t> members, const std::string& group_name,
                                                      c10::intrusive_ptr<c10d::Backend> real,
                                                      std::shared_ptr<const BackendContext> ctx) {
  const std::string what = "group " + (group_name.empty() ? std::string("?") : group_name);
  auto fail = [&](const std::string& message) { throw std::invalid_argument("prism: " + what + ": " + message); };
  if (!ctx) {
    throw std::runtime_error("prism: the backend is not active; call prism_megatron.backend.activate() first");
  }
  if (group_size < 1 || group_size > ctx->world_size) {
    fail("group_size " + std::to_string(group_size) + " must lie in [1, " + std::to_string(ctx->world_size) +
         "] (the world size given at activation)");
  }
  if (static_cast<int64_t>(members.size()) != group_size) {
    fail("members has " + std::to_string(members.size()) + " virtual ranks but group_size is " +
         std::to_string(group_size) + "; give one member per group rank");
  }
  if (group_rank < 0 || group_rank >= group_size) {
    fail("group_rank " + std::to_string(group_rank) + " must lie in [0, group_size " + std::to_string(group_size) +
         ")");
  }
  GroupLayout layout = GroupLayout::checked(std::move(members), group_rank, *ctx, what);
  const int64_t k = layout.num_real();
  if ((k >= 2) != static_cast<bool>(real)) {
    fail("it has " + std::to_string(k) + (k == 1 ? " real member" : " real members") + ", so real must be " +
         (k >= 2 ? "the sub-communicator among them, got None" : "None, got a sub-communicator") +
         " (a real sub-communicator exactly when a group has two or more real members)");
  }
  if (real && (real->getSize() != k || real->getRank() != layout.self_real_index())) {
    fail("the real sub-communicator has rank " + std::to_string(real->getRank()) + " of " +
         std::to_string(real->getSize()) + ", expected rank " + std::to_string(layout.self_real_index()) + " of " +
         std::to_string(k) + " (this process's index among the group's real members, of their number)");
  }
  return c10::make_intrusive<PrismBackend>(std::move(layout), group_name, std::move(real), std::move(ctx));
}

PrismBackend::PrismBackend(GroupLayout layout, const std::string& group_name, c10::intrusive_ptr<c10d::Backend> real,
                           std::shared_ptr<const BackendContext> ctx)
    : c10d::Backend(static_cast<int>(layout.self_index()), static_cast<int>(layout.size())),
      layout_(std::move(layout)),
      real_(std::move(real)),
      ctx_(std::move(ctx)),
      timeout_ns_(ctx_->timeout_ns) {
  slot_ = replay::engine().group_slot(layout_.members());
  auto info = std::make_shared<replay::GroupInfo>();
  info->members = layout_.members();
  info->label = group_label(group_name, info->members);
  info_ = std::move(info);
  ranks_note_ = std::make_shared<const std::string>(ranks_note(layout_, *ctx_));
}

c10::intrusive_ptr<c10d::Backend::Options> PrismBackend::getBackendOptions() {
  auto options = c10::make_intrusive<Options>("prism", std::chrono::milliseconds(timeout_ns_ / 1'000'000));
  options->global_ranks_in_group.assign(layout_.members().begin(), layout_.members().end());
  return options;
}

void PrismBackend::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ns_ = static_cast<int64_t>(timeout.count()) * 1'000'000;
}

void PrismBackend::startCoalescing() {
  TORCH_CHECK(!coalescing_, "prism: startCoalescing on ", info_->label, " while already coalescing");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> PrismBackend::endCoalescing() {
  TORCH_CHECK(coalescing_, "prism: endCoalescing on ", info_->label, " without startCoalescing");
  coalescing_ = false;
  return c10::make_intrusive<CoalescedWork>(rank_, std::move(coalesced_));
}

RealStep PrismBackend::consistency_step(const OpPlan& plan, int64_t seq, const at::Device& device) {
  auto mine = at::empty({4}, at::kLong);
  auto* row = mine.data_ptr<int64_t>();
  row[0] = static_cast<int64_t>(plan.kind);
  row[1] = plan.size_varies ? -1 : plan.size_bytes;  // -1: not compared
  row[2] = static_cast<int64_t>(plan.dtype);
  row[3] = seq;
  const int64_t k = layout_.num_real();
  std::vector<std::vector<at::Tensor>> gathered(1);
  for (int64_t r = 0; r < k; ++r) {
    gathered[0].push_back(at::empty({4}, at::TensorOptions().dtype(at::kLong).device(device)));
  }
  std::vector<at::Tensor> inputs{device.is_cpu() ? mine : mine.to(device)};
  auto work = real_->allgather(gathered, inputs);
  std::vector<int64_t> real_members;
  for (int64_t r = 0; r < k; ++r) {
    real_members.push_back(layout_.members()[layout_.real_positions()[r]]);
  }
  auto check = [rows = gathered[0], mine, real_members, info = info_, seq, self = ctx_->virtual_rank]() {
    const int64_t* own = mine.data_ptr<int64_t>();
    std::ostringstream diffs;
    for (size_t r = 0; r < rows.size(); ++r) {
      const at::Tensor host_row = rows[r].is_cpu() ? rows[r] : rows[r].cpu();  // after the gather, on this thread
      const int64_t* other = host_row.data_ptr<int64_t>();
      if (std::equal(own, own + 4, other)) {
        continue;
      }
      diffs << "; virtual rank " << real_members[r] << " issued " << describe_signature(other)
            << (other[3] != own[3] ? " as its sequence number " + std::to_string(other[3]) : std::string());
    }
    const std::string text = diffs.str();
    if (!text.empty()) {
      throw PrismError("prism: collective mismatch on " + info->label + " at sequence number " +
                       std::to_string(seq) + ": virtual rank " + std::to_string(self) + " (this process) issued " +
                       describe_signature(own) + text);
    }
  };
  if (consistency_deferred()) {
    settle_completed_checks();  // an earlier op's mismatch raises here, at this op's issue
    {
      std::lock_guard<std::mutex> lock(deferred_checks().mu);
      deferred_checks().pending.push_back(RealStep{std::move(work), std::move(check)});
    }
    return RealStep{c10::make_intrusive<DoneWork>(), nullptr};
  }
  return RealStep{std::move(work), std::move(check), completes_unwaited(replay::OpKind::kAllGather)};
}

c10::intrusive_ptr<c10d::Work> PrismBackend::launch(OpPlan plan) {
  if (auto failure = device_failure()) {
    std::rethrow_exception(failure);  // the watchdog gave up on the run: every later op raises it
  }
  const int64_t issue_ns = clock::now_ns();
  const bool is_p2p = plan.kind == replay::OpKind::kSend || plan.kind == replay::OpKind::kRecv;
  const bool is_send = plan.kind == replay::OpKind::kSend;
  const bool has_virtual = is_p2p ? !layout_.is_real(plan.peer_index) : layout_.has_virtual();

  replay::OpRecord record;
  record.kind = plan.kind;
  record.size_bytes = plan.size_bytes;
  record.dtype = c10::toString(plan.dtype);
  record.issue_ns = issue_ns;
  record.start_ns = issue_ns;
  record.async_op = plan.async_op;
  record.has_virtual = has_virtual;
  if (is_p2p) {
    record.peer = layout_.members()[plan.peer_index];
    record.group = replay::op_log().p2p_group(ctx_->virtual_rank, record.peer);
    record.seq = replay::op_log().next_p2p_seq(record.peer, is_send);
  } else {
    record.group = info_;
    record.seq = next_seq_++;
  }

  WorkSpec spec;
  spec.op_type = plan.op_type;
  spec.timeout_ns = timeout_ns_;
  spec.kind = plan.kind;
  spec.seq = record.seq;
  spec.group = record.group;
  spec.ranks_note = ranks_note_;
  replay::Timing timing;
  if (has_virtual) {
    timing = is_p2p ? replay::engine().next_p2p(record.peer, is_send, plan.size_bytes, issue_ns)
                    : replay::engine().next_collective(*slot_, plan.kind, plan.size_bytes, issue_ns, info_->label);
    spec.deadline_ns = timing.completion_ns(issue_ns);
    record.start_ns = std::max(issue_ns, timing.arrival_ns);
    if (!timing.error.empty()) {
      spec.error = make_error(timing.error);
    }
  }
  device::Queue* queue = spec.error ? nullptr : queue_for(plan.device);
  if (has_virtual && queue == nullptr && timing.arrival_offset_ns != replay::kUnscheduled) {
    record.engine_done_ns = spec.deadline_ns;  // a scheduled op's completion, on the host path
  }
  if (queue != nullptr) {  // its times are marks on the device timeline, where its streams get
    record.issue_mark = timeline::mark_on(queue, queue->current_stream());
    record.start_mark = has_virtual ? timeline::reserve(queue) : record.issue_mark;
  }
  const int64_t start_mark = record.start_mark;
  spec.log_id = replay::op_log().begin(std::move(record));
  const bool real_part = real_ && (!is_p2p || !has_virtual);
  if (queue != nullptr) {
    auto work = launch_on_device(queue, std::move(plan), std::move(spec), timing, has_virtual, real_part, start_mark);
    if (coalescing_) {
      coalesced_.push_back(work);
    }
    return work;
  }

  if (!spec.error) {
    try {
      at::AutoDispatchBelowAutograd below_autograd;  // like a real backend, write below autograd
      // The check goes before the real part, so a mismatch raises before the real op can pair
      // with another op; deferred, it goes after it and nothing here waits for it (backend.h).
      const bool check = real_part && !is_p2p && ctx_->check_consistency;
      const bool deferred = check && consistency_deferred();
      if (check && !deferred) {
        spec.real_steps.push_back(consistency_step(plan, spec.seq, at::Device(at::kCPU)));
      }
      if (real_part && plan.issue_real) {
        if (auto real_work = plan.issue_real()) {  // null: this op needs nothing real after all
          spec.real_steps.push_back(RealStep{std::move(real_work), nullptr, completes_unwaited(plan.kind)});
        }
      }
      if (deferred) {
        consistency_step(plan, spec.seq, at::Device(at::kCPU));  // kept for later; returns a done step
      }
      if (spec.real_steps.empty()) {
        if (plan.local) {
          plan.local();
        }
      } else {
        spec.local = std::move(plan.local);
      }
    } catch (...) {
      replay::op_log().complete(spec.log_id, clock::now_ns(), false);
      throw;  // an argument error: raise at issue, as the real backends do
    }
  }
  spec.outputs = std::move(plan.outputs);
  auto work = c10::make_intrusive<PrismWork>(rank_, std::move(spec));
  if (coalescing_) {
    coalesced_.push_back(work);
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> PrismBackend::barrier(const c10d::BarrierOptions& opts) {
  OpPlan plan;
  plan.kind = replay::OpKind::kBarrier;
  plan.op_type = c10d::OpType::BARRIER;
  plan.dtype = at::kByte;
  plan.async_op = opts.asyncOp;
  plan.issue_real = [this, opts] { return real_->barrier(opts); };
  return launch(std::move(plan));
}

}  // namespace prism::backend
