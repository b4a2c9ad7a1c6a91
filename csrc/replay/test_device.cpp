// The asynchronous test device (contract in test_device.h): one worker thread per stream.
#include "replay/test_device.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "replay/clock.h"
#include "replay/timeline.h"

namespace prism::test_device {

namespace {

int64_t load(const int64_t* cell) { return __atomic_load_n(cell, __ATOMIC_ACQUIRE); }
void store(int64_t* cell, int64_t value) { __atomic_store_n(cell, value, __ATOMIC_RELEASE); }

// How often a blocked task re-reads the abort cell.
constexpr auto kAbortPoll = std::chrono::milliseconds(5);

// One stream: runs its tasks in order on its own thread.
class Worker {
 public:
  explicit Worker(int index) : index_(index), thread_([this] { loop(); }) {}

  // Enqueue; returns the task's ticket (the stream has run it once done() >= ticket).
  uint64_t push(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    cv_.notify_all();
    return ++enqueued_;
  }

  uint64_t enqueued() {
    std::lock_guard<std::mutex> lock(mu_);
    return enqueued_;
  }

  bool reached(uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mu_);
    return done_ >= ticket;
  }

  // Blocks until the stream has run `ticket`, or until abort_cell is set (when given).
  void wait_for(uint64_t ticket, const int64_t* abort_cell) {
    std::unique_lock<std::mutex> lock(mu_);
    while (done_ < ticket) {
      if (abort_cell != nullptr && load(abort_cell) != 0) {
        return;
      }
      cv_.wait_for(lock, kAbortPoll);
    }
  }

  int64_t pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(enqueued_ - done_);
  }

 private:
  void loop() {
    clock::lower_timer_slack();
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !tasks_.empty(); });
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      try {
        task();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "prism test device: a task on stream %d failed: %s\n", index_, e.what());
      }
      std::lock_guard<std::mutex> lock(mu_);
      ++done_;
      cv_.notify_all();
    }
  }

  int index_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  uint64_t enqueued_ = 0;
  uint64_t done_ = 0;
  std::thread thread_;  // last: starts once the members above exist
};

class TestEvent : public device::Event {
 public:
  TestEvent(std::shared_ptr<Worker> worker, uint64_t ticket) : worker(std::move(worker)), ticket(ticket) {}
  std::shared_ptr<Worker> worker;
  uint64_t ticket;
};

// Hold the calling worker until deadline_ns on the device clock, or until the abort cell is set.
void hold_until(int64_t deadline_ns, const int64_t* abort_cell) {
  constexpr int64_t kStepNs = 5'000'000;
  for (int64_t now = clock::now_ns(); now < deadline_ns; now = clock::now_ns()) {
    if (abort_cell != nullptr && load(abort_cell) != 0) {
      return;
    }
    clock::wait_until_ns(std::min(deadline_ns, now + kStepNs));
  }
}

class TestQueue : public device::Queue {
 public:
  const char* name() const override { return "test"; }

  device::StreamId current_stream() override { return current(); }

  device::StreamId new_stream() override {
    std::lock_guard<std::mutex> lock(mu_);
    workers_.push_back(std::make_shared<Worker>(static_cast<int>(workers_.size())));
    return static_cast<device::StreamId>(workers_.size() - 1);
  }

  std::shared_ptr<device::Event> record(device::StreamId stream) override {
    auto worker = at(stream);
    const uint64_t ticket = worker->enqueued();
    return std::make_shared<TestEvent>(std::move(worker), ticket);
  }

  void wait(device::StreamId stream, const std::shared_ptr<device::Event>& event) override {
    auto awaited = std::static_pointer_cast<TestEvent>(event);
    const int64_t* abort = timeline_abort();
    at(stream)->push([awaited, abort] { awaited->worker->wait_for(awaited->ticket, abort); });
  }

  bool query(const device::Event& event) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!device_error_.empty()) {
        throw std::runtime_error(device_error_);
      }
    }
    const auto& e = static_cast<const TestEvent&>(event);
    return e.worker->reached(e.ticket);
  }

  bool capturing(device::StreamId stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    return capturing_.count(stream) > 0;
  }

  void set_capturing(device::StreamId stream, bool on) {
    at(stream);  // raises for a stream that does not exist
    std::lock_guard<std::mutex> lock(mu_);
    if (on) {
      capturing_.insert(stream);
    } else {
      capturing_.erase(stream);
    }
  }

  void set_device_error(const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    device_error_ = message;
  }

  int64_t num_streams() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(workers_.size());
  }

  void synchronize(const device::Event& event) override {
    const auto& e = static_cast<const TestEvent&>(event);
    e.worker->wait_for(e.ticket, nullptr);
  }

  void stamp(device::StreamId stream, int64_t* cell) override {
    at(stream)->push([cell] { store(cell, clock::now_ns()); });
  }

  void wait_until(device::StreamId stream, const int64_t* start_cell, int64_t arrival_offset_ns, int64_t cost_ns,
                  int64_t* arrived_cell, const int64_t* abort_cell) override {
    at(stream)->push([=] {
      const int64_t own_arrival_ns = clock::now_ns();
      const int64_t arrived_ns = std::max(own_arrival_ns, load(start_cell) + arrival_offset_ns);
      if (arrived_cell != nullptr) {
        store(arrived_cell, arrived_ns);
      }
      hold_until(arrived_ns + cost_ns, abort_cell);
    });
  }

  void wait_flag(device::StreamId stream, const int64_t* flag, const int64_t* abort_cell) override {
    at(stream)->push([flag, abort_cell] {
      int64_t pause_ns = 1'000;
      while (load(flag) == 0 && load(abort_cell) == 0) {
        std::this_thread::sleep_for(std::chrono::nanoseconds(pause_ns));
        pause_ns = std::min<int64_t>(pause_ns * 2, 100'000);
      }
    });
  }

  void compute(device::StreamId stream, int64_t duration_ns) override {
    at(stream)->push([duration_ns] { clock::wait_until_ns(clock::now_ns() + duration_ns); });
  }

  bool data_on_host() const override { return true; }

  void synchronize_all() {
    std::vector<std::shared_ptr<Worker>> workers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      workers = workers_;
    }
    for (auto& w : workers) {
      w->wait_for(w->enqueued(), nullptr);
    }
  }

  int64_t pending() {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t total = 0;
    for (auto& w : workers_) {
      total += w->pending();
    }
    return total;
  }

  std::shared_ptr<Worker> at(device::StreamId stream) {
    std::lock_guard<std::mutex> lock(mu_);
    if (workers_.empty()) {
      workers_.push_back(std::make_shared<Worker>(0));  // the default stream
    }
    if (stream < 0 || stream >= static_cast<device::StreamId>(workers_.size())) {
      throw std::invalid_argument("prism test device: no stream " + std::to_string(stream) + " (it has " +
                                  std::to_string(workers_.size()) + ")");
    }
    return workers_[static_cast<size_t>(stream)];
  }

  static device::StreamId& current() {
    thread_local device::StreamId stream = 0;
    return stream;
  }

  static const int64_t* timeline_abort();

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<Worker>> workers_;
  std::set<device::StreamId> capturing_;  // streams "being captured into a graph" (set_capturing)
  std::string device_error_;              // non-empty: every query raises it (set_device_error)
};

// Never destroyed: its worker threads run until the process ends.
TestQueue& instance() {
  static auto* queue = new TestQueue();
  return *queue;
}

std::atomic<bool> is_active{false};

const int64_t* TestQueue::timeline_abort() { return timeline::abort_cell(&instance()); }

}  // namespace

void activate() {
  instance().at(0);  // make the default stream
  is_active.store(true);
}

void deactivate() {
  if (is_active.exchange(false)) {
    instance().synchronize_all();
  }
}

bool active() { return is_active.load(); }
device::Queue& queue() { return instance(); }
device::StreamId new_stream() { return instance().new_stream(); }
device::StreamId current_stream() { return TestQueue::current(); }

void set_current_stream(device::StreamId stream) {
  instance().at(stream);  // raises for a stream that does not exist
  TestQueue::current() = stream;
}

void synchronize() { instance().synchronize_all(); }
void synchronize_stream(device::StreamId stream) {
  auto worker = instance().at(stream);
  worker->wait_for(worker->enqueued(), nullptr);
}
int64_t num_pending() { return instance().pending(); }
int64_t num_streams() { return instance().num_streams(); }
void set_capturing(device::StreamId stream, bool on) { instance().set_capturing(stream, on); }
void set_device_error(const std::string& message) { instance().set_device_error(message); }

}  // namespace prism::test_device

namespace prism::device {

Queue* test_queue() { return test_device::active() ? &test_device::instance() : nullptr; }

}  // namespace prism::device
