// Exit gate for the backend's threads (contract in exit_guard.h).
#include "backend/exit_guard.h"

#include <mutex>

namespace prism::backend {

namespace {

struct Gate {
  std::mutex mu;
  bool closed = false;
};

// Never destroyed: the detached threads may ask while static destructors run.
Gate& gate() {
  static auto* instance = new Gate();
  return *instance;
}

}  // namespace

bool release_unless_exiting(const std::function<void()>& release) {
  Gate& g = gate();
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.closed) {
    return false;
  }
  release();
  return true;
}

void close_release_gate() {
  Gate& g = gate();
  std::lock_guard<std::mutex> lock(g.mu);
  g.closed = true;
}

}  // namespace prism::backend
