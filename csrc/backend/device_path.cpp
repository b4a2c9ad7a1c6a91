// The device path of the prism backend: ops on a device's tensors complete on the device's streams,
// the way NCCL completes on its communication stream. One code path for CUDA and for the
// asynchronous test device (replay/device_queue.h), so the test device proves it on any CPU.
//
// An op runs on the backend's own stream. That stream first waits for the issuing stream (the op's
// own arrival is when the device gets there), then for the real part among the real members, then
// the local part (mirror arithmetic), then a wait-until that holds the stream until
// max(own arrival, iteration start + the virtual members' arrival offset) + cost on the device
// clock. Work::wait() makes the caller's stream wait for the op's end; the host does not block,
// except for the real part of a gloo collective below. Compute queued on other streams overlaps the
// wait, as it would overlap NCCL.
//
// The real part:
//   - NCCL (the real members on distinct GPUs): issued on the host with the issuing stream current
//     (NCCL orders itself after it); the backend's stream waits for NCCL's on the device.
//   - gloo collectives (several real members sharing one GPU, where NCCL refuses a duplicate
//     device; and the test device): issued on the host in program order, and the host waits for
//     them right there, at issue (gloo itself would return and block in wait()); then our stream
//     waits for gloo's copy back on the device. Only real members sharing a device pay this: the
//     host loses its run-ahead at their collectives, and a program that needs a collective's issue
//     not to block (one that issues a collective before a send its peer waits for, the collective
//     being waited on only after) hangs until --prism-timeout; Megatron's schedules issue each
//     stage's sends and receives before the collectives its peers share with it.
//   - p2p between real ranks sharing one GPU: gloo cannot send CUDA tensors, so the transfer is
//     staged through the host: a send copies its tensor to pinned host memory at issue (the host
//     waits for the issuing stream there), a recv lands in pinned host memory. The host does not
//     wait for the transfer (a batch of sends and receives between two neighbours must all be
//     issued before any completes): a helper thread of the backend waits for gloo, then sets a
//     host flag that a wait-flag kernel on the backend's stream spins on; a recv's copy to the
//     device is queued behind that kernel at issue.
//   - The consistency check among real members (kind, bytes, dtype, seq) is issued with the real
//     part; a gloo collective's is checked with it at issue, NCCL's by the helper thread.
// Why the flag is set by host work alone: CUDA serialises device work queued after a page-locked
// host allocation or a device allocation (any thread of the process: gloo's staging buffers, the
// caching allocator) behind all work queued before it. A flag whose setter first needed device
// work of its own (a copy back, a stream synchronisation) could then wait for the very kernel that
// spins on the flag: the first run on an H200 hung so, with two real ranks on one GPU.
//
// Safety: a host watchdog thread watches every op in flight on a device. An op whose real part
// failed, or that has not completed --prism-timeout after its issue, fails the run (a gloo
// collective's real part that fails at issue fails it there, the same way): the watchdog
// prints the error with the flight recorder, ends every device wait (the abort cell the wait
// kernels watch), and the next call into the backend raises it as DistBackendError. A device that
// reports an error when the watchdog asks about an op (CUDA: a sticky error, such as an illegal
// address in any kernel) fails the run the same way, with the device's own message: the watchdog's
// thread is detached, and an exception escaping it would abort the process without that message.
//
// Refused: an op issued while its stream is captured into a CUDA graph. Its waits read the device
// clock and host flags when they run; a replayed graph would repeat them with stale start times
// and flags, so the op fails at issue with one clear error instead of hanging or lying later.
//
// Times: the op log holds marks on the device timeline (replay/timeline.h): the issue on the issuing
// stream, every member's arrival (written by the wait-until), and the completion where the program
// first waited on the op (a mark on its stream right after the wait), else the op's end.
#include <ATen/core/LegacyTypeDispatch.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "backend/backend.h"
#include "backend/exit_guard.h"
#include "replay/clock.h"
#include "replay/timeline.h"

#ifdef PRISM_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace prism::backend {

// The backend's two streams on a device, its own (Queue::new_stream), made once per backend: the
// communication stream its ops complete on, and the helper thread's, current while it runs the
// checks that touch device tensors (NCCL's consistency check); no flag waits for it. The two must
// never be one stream, which a pool that hands streams out again would sooner or later make them.
struct DeviceState {
  device::Queue* queue = nullptr;
  device::StreamId stream = 0;
  device::StreamId helper_stream = 0;
  int device_index = -1;  // CUDA device, -1 for the test device
};

// One op in flight on a device, shared by its Work, the helper thread and the watchdog.
struct DeviceOp {
  device::Queue* queue = nullptr;
  std::shared_ptr<device::Event> done;
  // The op's tensors (and what its parts captured): held until the program's stream waits for the op
  // (`release_tensors`) or, for an op never waited for, until the device is done with it.
  std::shared_ptr<OpPlan> plan;
  int64_t log_id = -1;
  int64_t done_mark = -1;
  int64_t issue_host_ns = 0;
  int64_t timeout_ns = 0;
  WorkSpec describe;  // kind, seq, group and ranks, for messages
  bool reported = false;  // the watchdog's own: its failure or timeout was raised once already
  uint64_t run = 0;       // the run it was issued in (run_generation): an earlier run's op blames no later run

  std::mutex mu;
  std::exception_ptr error;  // set by the helper thread: the real part or the check failed

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) {
      error = std::move(e);
    }
  }
  std::exception_ptr failure() {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }

  // The program's stream now waits for the op (Work::wait): let its tensors go, as NCCL lets the
  // tensors it stashed go at wait(). A block the program frees goes back to the stream that
  // allocated it: safe when that is the stream that waited (the usual case: issue and wait on one
  // stream), whose later work runs after the op; an output is also recorded on our stream. An input
  // allocated on another stream than the waiter's may be reused there while our stream still reads
  // it: the program's to order, as with NCCL. Held until the device was done instead, the tensors
  // stayed allocated past the program's own free, and the allocator's peak was higher than the same
  // program's over NCCL (an H200: 3 x 16 KiB, up to 6 x 128 KiB at the peak).
  void release_tensors() {
    std::shared_ptr<OpPlan> released;
    {
      std::lock_guard<std::mutex> lock(mu);
      released.swap(plan);
    }
  }
};

namespace {

#ifdef PRISM_WITH_CUDA
// One of the backend's streams (a device::StreamId is a cudaStream_t on CUDA) as torch's stream.
c10::cuda::CUDAStream cuda_stream(device::StreamId stream, int device_index) {
  return c10::cuda::getStreamFromExternal(reinterpret_cast<cudaStream_t>(stream),
                                          static_cast<c10::DeviceIndex>(device_index));
}
#endif

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

// The first failure of a device run, raised by every later call into the backend. Never destroyed,
// like the watchdog below: its detached thread may report a failure while the process exits.
struct RunFailure {
  std::mutex mu;
  std::exception_ptr error;
};

RunFailure& run_failure() {
  static auto* instance = new RunFailure();
  return *instance;
}

// Counts the runs clear_device_failure began. An op of an earlier run can still be on the
// watchdog's list when the next run's device fails (done, but not looked at yet): a sticky device
// error raises from every query, and the message must name an op of the run that failed.
std::atomic<uint64_t>& run_generation() {
  static std::atomic<uint64_t> generation{0};
  return generation;
}

void fail_run(const std::string& message) {
  RunFailure& failure = run_failure();
  std::lock_guard<std::mutex> lock(failure.mu);
  if (failure.error) {
    return;
  }
  failure.error = make_error(message);  // appends the flight recorder
  std::fprintf(stderr, "%s\n", message_of(failure.error).c_str());
  timeline::abort_device_waits();
}

// Watches the ops in flight on devices (see the file comment). Never destroyed: it holds the
// in-flight ops' CUDA events and tensors, and a static would destroy them at exit after CUDA's own
// teardown (the runtime and the caching allocator register theirs later, at first use, so they run
// first), which can crash the exiting process; its detached thread may also still run then. The
// process is ending; the driver reclaims both.
class Watchdog {
 public:
  void add(std::shared_ptr<DeviceOp> op) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) {
      started_ = true;
      std::thread([this] { loop(); }).detach();
    }
    in_flight_.push_back(std::move(op));
  }

 private:
  void loop() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::deque<std::shared_ptr<DeviceOp>> ops;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ops.swap(in_flight_);
      }
      std::deque<std::shared_ptr<DeviceOp>> still;
      std::vector<std::shared_ptr<DeviceOp>> finished;
      const int64_t now_ns = clock::now_ns();
      for (auto& op : ops) {
        // Done first: the helper thread sets an op's error before it releases the op's flag, so a
        // done op's failure is already visible below.
        bool done = false;
        if (op->run != run_generation().load()) {
          op->reported = true;  // an earlier run's: it fails no later one
        }
        try {
          done = op->queue->query(*op->done);
        } catch (...) {
          device_failed(*op, std::current_exception());
          lost_.push_back(std::move(op));  // kept: the failed device may still hold its tensors
          continue;
        }
        // Each op fails the run once: after a deactivation clears the failure, an op of that run
        // still on its stream must not fail the next one.
        if (!op->reported) {
          if (auto error = op->failure()) {
            fail_run(message_of(error));
            op->reported = true;
          } else if (!done && now_ns - op->issue_host_ns > op->timeout_ns && !timeline::aborted()) {
            fail_run("prism: timeout: " + op->describe.what() + " did not complete on the device within " +
                     std::to_string(op->timeout_ns / 1'000'000'000) +
                     " s of its issue (--prism-timeout); every device wait was ended");
            op->reported = true;
          }
        }
        if (done) {
          finished.push_back(std::move(op));  // its tensors may go
          continue;
        }
        still.push_back(std::move(op));
      }
      // Every reference of `ops` has moved; the finished ops' tensors go here or, once the
      // interpreter is exiting, never (exit_guard.h).
      if (!release_unless_exiting([&] { finished.clear(); })) {
        new std::vector<std::shared_ptr<DeviceOp>>(std::move(finished));
      }
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = still.rbegin(); it != still.rend(); ++it) {
        in_flight_.push_front(std::move(*it));
      }
    }
  }

  // The device could not say whether the op is done: it failed (see the file comment).
  static void device_failed(DeviceOp& op, const std::exception_ptr& error) {
    if (!op.reported && !timeline::aborted()) {
      fail_run("prism: the " + std::string(op.queue->name()) + " device reported an error while " +
               op.describe.what() + " was in flight: " + message_of(error) + "; every device wait was ended");
    }
    op.reported = true;
  }

  std::mutex mu_;
  std::deque<std::shared_ptr<DeviceOp>> in_flight_;
  std::vector<std::shared_ptr<DeviceOp>> lost_;  // the watchdog's thread only
  bool started_ = false;
};

Watchdog& watchdog() {
  static auto* instance = new Watchdog();
  return *instance;
}

}  // namespace

std::exception_ptr device_failure() {
  RunFailure& failure = run_failure();
  std::lock_guard<std::mutex> lock(failure.mu);
  return failure.error;
}

void clear_device_failure() {
  RunFailure& failure = run_failure();
  std::lock_guard<std::mutex> lock(failure.mu);
  failure.error = nullptr;
  run_generation().fetch_add(1);
  timeline::clear_abort();
}

// Waits for an op's real steps in order, each bounded by what is left of the op's timeout, and runs
// each step's check after it.
void wait_real_steps(std::vector<RealStep>& steps, const DeviceOp& op) {
  const int64_t limit_ns = op.issue_host_ns + op.timeout_ns;
  for (auto& step : steps) {
    const int64_t remaining_ns = std::max<int64_t>(limit_ns - clock::now_ns(), 1'000'000);
    step.work->wait(std::chrono::milliseconds((remaining_ns + 999'999) / 1'000'000));
    if (step.then) {
      step.then();
    }
  }
}

// What the helper thread does for one op: wait for its real steps, run what follows them, flag it.
struct HostJob {
  std::vector<RealStep> steps;
  std::function<void()> after;  // the local part, when the data live on the host (test device)
  int64_t flag = -1;            // set when done; -1: the device does not wait for this job
  std::shared_ptr<DeviceOp> op;
  int device_index = -1;        // CUDA: the device whose helper stream is current; -1: none
  device::StreamId helper_stream = 0;  // CUDA: the backend's helper stream (DeviceState)
};

// The backend's helper thread: waits for real parts in issue order, off the program's thread.
class RealPartWaiter {
 public:
  RealPartWaiter() : thread_([this] { loop(); }) {}
  ~RealPartWaiter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    thread_.join();  // drains the queue first; every wait there is bounded by the op's timeout
  }

  void submit(HostJob job) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    cv_.notify_all();
  }

 private:
  void loop() {
    for (;;) {
      HostJob job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) {
          return;
        }
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      run(job);
    }
  }

  void run(HostJob& job) {
    try {
#ifdef PRISM_WITH_CUDA
      // A check on device tensors (NCCL's consistency check) runs with the backend's helper stream
      // current, synchronised before the job ends. No flagged job comes here: a flag is set by host
      // work alone (see the file comment).
      std::optional<c10::cuda::CUDAStreamGuard> guard;
      if (job.device_index >= 0) {
        guard.emplace(cuda_stream(job.helper_stream, job.device_index));
      }
#endif
      wait_real_steps(job.steps, *job.op);
      if (job.after) {
        at::AutoDispatchBelowAutograd below_autograd;
        job.after();
      }
#ifdef PRISM_WITH_CUDA
      if (guard) {
        const cudaError_t status = cudaStreamSynchronize(guard->current_stream().stream());
        TORCH_CHECK(status == cudaSuccess, "cudaStreamSynchronize: ", cudaGetErrorString(status));
      }
#endif
      if (job.flag >= 0) {
        timeline::set_flag(job.flag, device::kFlagDone);
      }
    } catch (...) {
      const std::string text = "prism: " + job.op->describe.what() + " failed: " + message_of(std::current_exception());
      job.op->fail(std::make_exception_ptr(PrismError(text)));
      if (job.flag >= 0) {
        timeline::set_flag(job.flag, device::kFlagFailed);
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<HostJob> jobs_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

namespace {

class DeviceWork : public c10d::Work {
 public:
  DeviceWork(int group_rank, c10d::OpType op_type, std::vector<at::Tensor> outputs, std::shared_ptr<DeviceOp> op,
             device::StreamId stream, int device_index)
      : c10d::Work(group_rank, op_type),
        outputs_(std::move(outputs)),
        op_(std::move(op)),
        stream_(stream),
        device_index_(device_index) {}

  bool isCompleted() override {
    if (op_->failure()) {
      return true;
    }
    if (!op_->queue->query(*op_->done)) {
      return false;
    }
    replay::op_log().complete_marked(op_->log_id, op_->done_mark, true);
    return true;
  }

  bool isSuccess() const override { return !op_->failure(); }

  // The caller's stream waits for the op; the host does not.
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    if (auto failure = device_failure()) {
      std::rethrow_exception(failure);
    }
    if (auto error = op_->failure()) {
      std::rethrow_exception(make_error(message_of(error)));
    }
    const device::StreamId waiter = op_->queue->current_stream();
    op_->queue->wait(waiter, op_->done);
    if (!waited_.exchange(true)) {
      replay::op_log().complete_marked(op_->log_id, timeline::mark_on(op_->queue, waiter), true);
    }
    op_->release_tensors();
    return true;
  }

  void synchronize() override { wait(kNoTimeout); }

  std::vector<at::Tensor> result() override { return outputs_; }

  // CUDA: a CUDA-aware future whose completion is the op's end on our stream (a waiter's stream
  // waits for it). Test device: the data are on the host already; the future is complete.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::vector<c10::Device> devices;
#ifdef PRISM_WITH_CUDA
    if (device_index_ >= 0) {
      const auto index = static_cast<c10::DeviceIndex>(device_index_);
      devices.emplace_back(c10::kCUDA, index);
      auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
      const c10::cuda::CUDAStreamGuard guard(cuda_stream(stream_, device_index_));
      future->markCompleted(c10::IValue(outputs_));
      return future;
    }
#endif
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
    future->markCompleted(c10::IValue(outputs_));
    return future;
  }

 private:
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<DeviceOp> op_;
  device::StreamId stream_;
  int device_index_;
  std::atomic<bool> waited_{false};
};

}  // namespace

c10::intrusive_ptr<c10d::Work> PrismBackend::issue_staged_p2p(OpPlan& plan, std::function<void()>& unstage) {
  std::vector<at::Tensor> staged;
  for (const auto& t : plan.p2p_tensors) {
    staged.push_back(at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true)));
  }
  const int peer = static_cast<int>(plan.real_peer);
  if (plan.kind == replay::OpKind::kSend) {
    for (size_t i = 0; i < staged.size(); ++i) {
      staged[i].copy_(plan.p2p_tensors[i]);  // blocking: the data the issuing stream has produced
    }
    plan.outputs.insert(plan.outputs.end(), staged.begin(), staged.end());  // gloo's send work holds them too
    return real_->send(staged, peer, plan.tag);
  }
  auto work = real_->recv(staged, peer, plan.tag);
  unstage = [targets = plan.p2p_tensors, staged]() mutable {
    for (size_t i = 0; i < targets.size(); ++i) {
      targets[i].copy_(staged[i], /*non_blocking=*/true);  // on our stream; the host allocator keeps staged[i] until it ran
    }
  };
  return work;
}

device::Queue* queue_for(const at::Device& device) {
  if (device.is_cuda()) {
#ifdef PRISM_WITH_CUDA
    return device::cuda_queue(device.index() < 0 ? 0 : device.index());
#else
    TORCH_CHECK(false, "prism: an op on CUDA tensors needs prism_megatron._C built with CUDA");
#endif
  }
  return device::test_queue();
}

c10::intrusive_ptr<c10d::Work> PrismBackend::launch_on_device(device::Queue* queue, OpPlan plan, WorkSpec spec,
                                                              const replay::Timing& timing, bool has_virtual,
                                                              bool real_part, int64_t start_mark) {
  const int device_index = plan.device.is_cuda() ? std::max<int>(plan.device.index(), 0) : -1;
#ifdef PRISM_WITH_CUDA
  std::optional<c10::cuda::CUDAGuard> device_guard;
  if (device_index >= 0) {
    device_guard.emplace(static_cast<c10::DeviceIndex>(device_index));
  }
#endif
  const device::StreamId issuing = queue->current_stream();
  if (queue->capturing(issuing)) {
    replay::op_log().complete(spec.log_id, clock::now_ns(), false);
    TORCH_CHECK(false, "prism: ", spec.what(),
                " was issued while its stream is being captured into a CUDA graph; the prism backend's ops "
                "cannot be captured (their device waits read the clock and host flags when they run, and a "
                "replay would repeat them with stale values): issue collectives outside torch.cuda.graph "
                "(Megatron: leave --cuda-graph-impl at none, --enable-cuda-graph and --external-cuda-graph off)");
  }
  if (!device_ || device_->queue != queue) {
    const device::StreamId comm_stream = queue->new_stream();
    device_ = std::make_shared<DeviceState>(DeviceState{queue, comm_stream, queue->new_stream(), device_index});
  }
  const device::StreamId stream = device_->stream;
  auto owned = std::make_shared<OpPlan>(std::move(plan));
  auto op = std::make_shared<DeviceOp>();
  op->queue = queue;
  op->plan = owned;
  op->log_id = spec.log_id;
  op->issue_host_ns = clock::now_ns();
  op->timeout_ns = timeout_ns_;
  op->run = run_generation().load();
  op->describe.kind = spec.kind;
  op->describe.seq = spec.seq;
  op->describe.group = spec.group;
  op->describe.ranks_note = spec.ranks_note;
  try {
    at::AutoDispatchBelowAutograd below_autograd;  // like a real backend, write below autograd
    const bool is_p2p = owned->kind == replay::OpKind::kSend || owned->kind == replay::OpKind::kRecv;
    const bool nccl = real_part && real_->getBackendName() == "nccl";
    HostJob job;
    job.op = op;
    job.device_index = queue->data_on_host() ? -1 : device_index;
    job.helper_stream = device_->helper_stream;
    if (real_part && !is_p2p && ctx_->check_consistency) {
      job.steps.push_back(consistency_step(*owned, spec.seq, nccl ? owned->device : at::Device(at::kCPU)));
    }
    c10::intrusive_ptr<c10d::Work> real_work;
    std::function<void()> unstage;  // a staged recv: host buffer to the device, on our stream after the flag
    if (real_part && is_p2p && !nccl && device_index >= 0 && owned->real_peer >= 0) {
      real_work = issue_staged_p2p(*owned, unstage);
    } else if (real_part && owned->issue_real) {
      real_work = owned->issue_real();  // in program order, with the issuing stream current
    }
    auto ready = queue->record(issuing);
    queue->wait(stream, ready);
    bool local_pending = static_cast<bool>(owned->local);
    if (real_work && nccl) {
#ifdef PRISM_WITH_CUDA
      const c10::cuda::CUDAStreamGuard on_stream(cuda_stream(stream, device_index));
      // Our stream waits for NCCL's; the host does not. Known hazard, never run (one GPU per task so
      // far): NCCL lets its stashed tensors go here, so a temporary that issue_real made on the
      // issuing stream (the real chunks of a mixed reduce-scatter) can be reused there before NCCL
      // has read it; keeping the real part's inputs in the plan until the device is done would close it.
      real_work->wait();
#endif
    } else if (real_work && !is_p2p) {
      // gloo among real members sharing the device: the host waits for the real part here, at issue,
      // and our stream then waits for gloo's copy back on the device. Never a device wait for a flag
      // whose setter needs the device: see the file comment (implicit synchronisation).
      job.steps.push_back(RealStep{std::move(real_work), nullptr});
#ifdef PRISM_WITH_CUDA
      std::optional<c10::cuda::CUDAStreamGuard> on_stream;
      if (!queue->data_on_host()) {
        on_stream.emplace(cuda_stream(stream, device_index));
      }
#endif
      try {
        wait_real_steps(job.steps, *op);
      } catch (...) {  // fails the run, as the helper thread's failure would: every later call raises it
        const std::string text = "prism: " + op->describe.what() + " failed: " + message_of(std::current_exception());
        fail_run(text);
        const std::exception_ptr failure = device_failure();  // this one, or an earlier failure of the run
        std::rethrow_exception(failure ? failure : make_error(text));
      }
      job.steps.clear();
    } else if (real_work) {
      // A p2p transfer staged through the host: the helper thread waits for gloo and sets the flag,
      // host work alone; a staged recv's copy to the device is queued behind the flag right here.
      job.steps.push_back(RealStep{std::move(real_work), nullptr});
      job.flag = timeline::reserve(queue);
      job.device_index = -1;  // the helper queues nothing on the device
      if (queue->data_on_host()) {
        job.after = owned->local;  // after the real part, on the helper thread
        local_pending = false;
      }
    }
    const int64_t flag = job.flag;
    if (!job.steps.empty()) {
      if (!waiter_) {
        waiter_ = std::make_shared<RealPartWaiter>();
      }
      waiter_->submit(std::move(job));
    }
    if (flag >= 0) {
      queue->wait_flag(stream, timeline::cell(flag), timeline::abort_cell(queue));
    }
    if (unstage) {
#ifdef PRISM_WITH_CUDA
      const c10::cuda::CUDAStreamGuard on_stream(cuda_stream(stream, device_index));
      unstage();  // its copies go on our stream, after the flag
#endif
    }
    if (local_pending) {
      if (queue->data_on_host()) {
        owned->local();  // the host's data are already in program order
      } else {
#ifdef PRISM_WITH_CUDA
        const c10::cuda::CUDAStreamGuard on_stream(cuda_stream(stream, device_index));
        owned->local();  // its kernels go on our stream
#endif
      }
    }
    if (has_virtual) {
      const int64_t* start_cell =
          timing.start_mark >= 0 ? timeline::cell(timing.start_mark) : timeline::zero_cell(queue);
      queue->wait_until(stream, start_cell, timing.arrival_offset_ns, timing.cost_ns, timeline::cell(start_mark),
                        timeline::abort_cell(queue));
    }
#ifdef PRISM_WITH_CUDA
    if (device_index >= 0) {
      const auto ours = cuda_stream(stream, device_index);
      for (const auto& t : owned->outputs) {
        c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), ours);
      }
    }
#endif
    op->done_mark = timeline::mark_on(queue, stream);
    op->done = queue->record(stream);
    watchdog().add(op);
    return c10::make_intrusive<DeviceWork>(rank_, spec.op_type, owned->outputs, op, stream, device_index);
  } catch (...) {
    replay::op_log().complete(spec.log_id, clock::now_ns(), false);
    throw;
  }
}

}  // namespace prism::backend
