// The Work of the prism backend: an op's real part (works on the real sub-communicator), its local
// part (virtual contributions, run once the real part is done) and its timed completion (the
// replay engine's deadline), with errors and timeouts raised from wait().
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "abi_probe.h"
#include "replay/engine.h"
#include "replay/op_log.h"

namespace prism::backend {

// One step of an op's real part: a work on the real sub-communicator, then a check on its result.
struct RealStep {
  c10::intrusive_ptr<c10d::Work> work;
  std::function<void()> then;  // may throw (e.g. the consistency check); may be empty
  // Its work completes on gloo's own threads, so it may be polled (set_poll_real_waits). Not so for
  // gloo's reduce-scatter, send and recv, which run or finish inside wait(): polled, they would only
  // complete once polling gave up.
  bool pollable = false;
};

// Whether gloo completes an op of this kind without the caller's wait() (torch 2.13, measured:
// all-reduce, all-gather, broadcast, barrier, all-to-all, gather and reduce do).
bool completes_unwaited(replay::OpKind kind);

struct WorkSpec {
  c10d::OpType op_type = c10d::OpType::UNKNOWN;
  std::vector<RealStep> real_steps;  // waited in order
  std::function<void()> local;       // after the real steps; may be empty
  int64_t deadline_ns = 0;           // the engine's completion time; 0: none (all members real)
  int64_t timeout_ns = 0;            // a wait longer than this raises
  std::vector<at::Tensor> outputs;   // Work::result() and the future's value
  int64_t log_id = -1;               // the op log record to complete
  // For error messages, built only when one is raised: "ALL_REDUCE seq 3 on group 7 [...]" and
  // who is real in that group.
  replay::OpKind kind = replay::OpKind::kAllReduce;
  int64_t seq = 0;
  std::shared_ptr<const replay::GroupInfo> group;
  std::shared_ptr<const std::string> ranks_note;
  std::exception_ptr error;          // set: the op failed at issue; wait() raises it

  std::string what() const;
};

// An error whose message is already complete (names group, op, seq and ranks): raised as is.
class PrismError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class PrismWork : public c10d::Work {
 public:
  PrismWork(int group_rank, WorkSpec spec);
  ~PrismWork() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  std::vector<at::Tensor> result() override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // Drive the op to completion on this thread (real steps, local part, deadline); records the
  // outcome. timeout_ns <= 0 means the op's own timeout. `program_waits`: the thread is the
  // program's, blocked in wait(), and waits for the deadline with clock::await_until_ns (keeping
  // its core where the process owns it); the completion thread sleeps instead, so as not to take
  // the core from the program's computation.
  void run(int64_t timeout_ns, bool program_waits = false);

 private:
  void run_locked(int64_t timeout_ns, bool program_waits);
  void settle(std::exception_ptr error);
  std::exception_ptr wrap(std::exception_ptr raw, int64_t waited_ns, int64_t timeout_ns) const;

  std::mutex run_mu_;  // one thread drives the op at a time
  WorkSpec spec_;
  size_t next_step_ = 0;
  bool local_done_ = false;
  std::mutex future_mu_;  // guards settled_ and future_
  bool settled_ = false;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// One Work for the ops issued between startCoalescing and endCoalescing.
class CoalescedWork : public c10d::Work {
 public:
  CoalescedWork(int group_rank, std::vector<c10::intrusive_ptr<c10d::Work>> works);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  std::vector<at::Tensor> result() override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

// A DistBackendError naming the op, with the flight recorder's dump appended.
std::exception_ptr make_error(const std::string& message);

}  // namespace prism::backend

PRISM_ABI_PROBE(WorkSpec, ::prism::backend::WorkSpec)
PRISM_ABI_PROBE(PrismWork, ::prism::backend::PrismWork)
