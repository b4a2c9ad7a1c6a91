// The prism Work (contract in work.h).
//
// wait() drives the op on the caller's thread: the real steps in order (each may raise), the local
// part once, then the timed completion, spinning in C++ with the GIL released (torch's Work.wait
// binding releases it). isCompleted() drives it without blocking. getFuture() hands the op to one
// completion thread that drives it and then completes the future, so futures complete at the op's
// time without Python on the path.
#include "backend/work.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>

#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <sstream>
#include <thread>

#include "backend/exit_guard.h"
#include "replay/clock.h"

namespace prism::backend {

namespace {

// Longest a real step is polled before the wait blocks: a guard, should a kind taken for pollable
// stop completing on its own in another torch release (the wait then still ends, this much late).
constexpr int64_t kMaxPollNs = 50'000'000;

// Wait for one real step until limit_ns (at least 1 ms more): polled where it may be
// (set_poll_real_waits, RealStep::pollable), then gloo's own wait, which returns at once for a
// completed op and raises its error or the timeout.
void wait_real_step(RealStep& step, int64_t limit_ns) {
  c10d::Work& work = *step.work;
  if (step.pollable && clock::active_waits()) {
    const int64_t poll_until = std::min(limit_ns, clock::now_ns() + kMaxPollNs);
    while (!work.isCompleted() && clock::now_ns() < poll_until) {
      sched_yield();
    }
  }
  const int64_t remaining_ns = std::max<int64_t>(limit_ns - clock::now_ns(), 1'000'000);
  work.wait(std::chrono::milliseconds((remaining_ns + 999'999) / 1'000'000));
}

// Drives, in submission order, the works whose futures somebody holds.
class Completer {
 public:
  void submit(c10::intrusive_ptr<PrismWork> work) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) {
      started_ = true;
      std::thread([this] { loop(); }).detach();
    }
    queue_.push_back(std::move(work));
    cv_.notify_one();
  }

 private:
  void loop() {
    clock::lower_timer_slack();
    for (;;) {
      c10::intrusive_ptr<PrismWork> work;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      work->run(0);
      // Its tensors go here or, once the interpreter is exiting, never (exit_guard.h).
      if (!release_unless_exiting([&] { work.reset(); })) {
        (void)work.release();  // leaked
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<PrismWork>> queue_;
  bool started_ = false;
};

// Never destroyed: the detached thread may still run while static destructors do.
Completer& completer() {
  static auto* instance = new Completer();
  return *instance;
}

std::string seconds(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f s", static_cast<double>(ns) / 1e9);
  return buf;
}

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

}  // namespace

std::exception_ptr make_error(const std::string& message) {
  const std::string text = message + "\n" + replay::op_log().dump(clock::now_ns());
  return std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, __LINE__}, text));
}

std::string WorkSpec::what() const {
  std::ostringstream out;
  out << replay::op_kind_name(kind) << " seq " << seq << " on " << (group ? group->label : std::string("?"));
  if (ranks_note) {
    out << " (" << *ranks_note << ")";
  }
  return out.str();
}

PrismWork::PrismWork(int group_rank, WorkSpec spec)
    : c10d::Work(group_rank, spec.op_type), spec_(std::move(spec)) {}

PrismWork::~PrismWork() = default;

void PrismWork::settle(std::exception_ptr error) {
  replay::op_log().complete(spec_.log_id, clock::now_ns(), error == nullptr);
  finish(error);  // Work's own state: completed_, exception_, waiters
  std::lock_guard<std::mutex> lock(future_mu_);
  settled_ = true;
  if (future_) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(spec_.outputs));
    }
  }
}

std::exception_ptr PrismWork::wrap(std::exception_ptr raw, int64_t waited_ns, int64_t timeout_ns) const {
  try {
    std::rethrow_exception(raw);
  } catch (const PrismError& e) {
    return make_error(e.what());
  } catch (...) {
  }
  std::string text;
  if (waited_ns >= timeout_ns) {
    text = "prism: timeout: " + spec_.what() + " did not complete within " + seconds(timeout_ns) +
           " (--prism-timeout): " + message_of(raw);
  } else {
    text = "prism: " + spec_.what() + " failed: " + message_of(raw);
  }
  return make_error(text);
}

void PrismWork::run(int64_t timeout_ns, bool program_waits) {
  std::lock_guard<std::mutex> lock(run_mu_);
  run_locked(timeout_ns, program_waits);
}

void PrismWork::run_locked(int64_t timeout_ns, bool program_waits) {
  {
    std::lock_guard<std::mutex> lock(future_mu_);
    if (settled_) {
      return;
    }
  }
  if (spec_.error) {
    settle(spec_.error);
    return;
  }
  if (timeout_ns <= 0) {
    timeout_ns = spec_.timeout_ns;
  }
  const int64_t start_ns = clock::now_ns();
  const int64_t limit_ns = start_ns + timeout_ns;
  try {
    const bool has_real_part = next_step_ < spec_.real_steps.size();
    for (; next_step_ < spec_.real_steps.size(); ++next_step_) {
      auto& step = spec_.real_steps[next_step_];
      wait_real_step(step, limit_ns);
      if (step.then) {
        step.then();
      }
    }
    if (has_real_part) {  // what the real members took, apart from the engine's deadline below
      replay::op_log().real_part_done(spec_.log_id, clock::now_ns());
    }
    if (!local_done_) {
      local_done_ = true;
      if (spec_.local) {
        at::AutoDispatchBelowAutograd below_autograd;  // like a real backend, write below autograd
        spec_.local();
      }
    }
    if (spec_.deadline_ns > limit_ns) {
      clock::wait_until_ns(limit_ns);
      throw std::runtime_error("the replay engine completes it " + seconds(spec_.deadline_ns - start_ns) +
                               " after the wait began (a virtual peer arrives that late)");
    }
    if (program_waits) {
      clock::await_until_ns(spec_.deadline_ns);
    } else {
      clock::wait_until_ns(spec_.deadline_ns);
    }
    settle(nullptr);
  } catch (...) {
    settle(wrap(std::current_exception(), clock::now_ns() - start_ns, timeout_ns));
  }
}

bool PrismWork::wait(std::chrono::milliseconds timeout) {
  replay::op_log().waited(spec_.log_id, clock::now_ns());  // where the program's compute stopped
  run(static_cast<int64_t>(timeout.count()) * 1'000'000, /*program_waits=*/true);
  std::lock_guard<std::mutex> lock(mutex_);
  if (exception_) {
    std::rethrow_exception(exception_);
  }
  return true;
}

bool PrismWork::isCompleted() {
  {
    // First, without run_mu_: the thread that settled the op holds run_mu_ until it returns, after
    // the future has already woken its waiter, who must then see the op completed.
    std::lock_guard<std::mutex> future_lock(future_mu_);
    if (settled_) {
      return true;
    }
  }
  std::unique_lock<std::mutex> lock(run_mu_, std::try_to_lock);
  if (!lock.owns_lock()) {
    return false;  // another thread is driving it
  }
  {
    std::lock_guard<std::mutex> future_lock(future_mu_);
    if (settled_) {
      return true;
    }
  }
  if (!spec_.error) {
    for (size_t i = next_step_; i < spec_.real_steps.size(); ++i) {
      if (!spec_.real_steps[i].work->isCompleted()) {
        return false;
      }
    }
    if (clock::now_ns() < spec_.deadline_ns) {
      return false;
    }
  }
  run_locked(0, false);  // everything it waits for is done: this neither blocks nor spins
  return true;
}

bool PrismWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr PrismWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

std::vector<at::Tensor> PrismWork::result() { return spec_.outputs; }

c10::intrusive_ptr<c10::ivalue::Future> PrismWork::getFuture() {
  std::lock_guard<std::mutex> lock(future_mu_);
  if (!future_) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    if (!settled_) {
      completer().submit(c10::intrusive_ptr<PrismWork>::reclaim_copy(this));
    } else if (exception_) {
      future_->setError(exception_);
    } else {
      future_->markCompleted(c10::IValue(spec_.outputs));
    }
  }
  return future_;
}

CoalescedWork::CoalescedWork(int group_rank, std::vector<c10::intrusive_ptr<c10d::Work>> works)
    : c10d::Work(group_rank, c10d::OpType::COALESCED), works_(std::move(works)) {}

bool CoalescedWork::isCompleted() {
  for (auto& work : works_) {
    if (!work->isCompleted()) {
      return false;
    }
  }
  return true;
}

bool CoalescedWork::isSuccess() const {
  for (const auto& work : works_) {
    if (!work->isSuccess()) {
      return false;
    }
  }
  return true;
}

std::exception_ptr CoalescedWork::exception() const {
  for (const auto& work : works_) {
    if (auto error = work->exception()) {
      return error;
    }
  }
  return nullptr;
}

bool CoalescedWork::wait(std::chrono::milliseconds timeout) {
  for (auto& work : works_) {
    work->wait(timeout);
  }
  return true;
}

std::vector<at::Tensor> CoalescedWork::result() {
  std::vector<at::Tensor> outputs;
  for (auto& work : works_) {
    auto part = work->result();
    outputs.insert(outputs.end(), part.begin(), part.end());
  }
  return outputs;
}

c10::intrusive_ptr<c10::ivalue::Future> CoalescedWork::getFuture() {
  const auto tensors_type = c10::ListType::create(c10::TensorType::get());
  c10::List<c10::intrusive_ptr<c10::ivalue::Future>> futures(c10::FutureType::create(tensors_type));
  for (auto& work : works_) {
    futures.push_back(work->getFuture());
  }
  auto outputs = result();
  return c10::collectAll(futures)->then(
      [outputs](c10::ivalue::Future& done) -> c10::IValue {
        for (const auto& part : done.value().toListRef()) {
          if (part.toFuture()->hasError()) {
            std::rethrow_exception(part.toFuture()->exception_ptr());
          }
        }
        return c10::IValue(outputs);
      },
      tensors_type);
}

bool completes_unwaited(replay::OpKind kind) {
  switch (kind) {
    case replay::OpKind::kAllReduce:
    case replay::OpKind::kAllGather:
    case replay::OpKind::kBroadcast:
    case replay::OpKind::kBarrier:
    case replay::OpKind::kAllToAll:
    case replay::OpKind::kGather:
    case replay::OpKind::kReduce:
      return true;
    default:  // reduce-scatter, send, recv, scatter: finished inside gloo's wait()
      return false;
  }
}

void set_poll_real_waits(bool poll) { clock::set_active_waits(poll); }

bool poll_real_waits() { return clock::active_waits(); }

}  // namespace prism::backend
