// Releasing tensors on the backend's own threads without crashing the exiting interpreter.
//
// The backend's detached threads (the device path's watchdog, the future completer) drop the last
// reference to ops they hold. An op's tensor can own its Python object (torch hands ownership to C++
// when Python drops its last reference first), and freeing it then takes the GIL. Once the
// interpreter is finalizing, a thread that asks for the GIL is ended by pthread_exit, whose forced
// unwind cannot pass the noexcept destructor it is in: std::terminate, SIGABRT at the end of a run
// that succeeded. So the threads release under a lock, and an atexit hook (registered by
// `prism_megatron.backend` at import) takes that lock and closes it before the interpreter finalizes:
// from then on the threads leak what they would have freed (the process is ending).
#pragma once

#include <functional>

namespace prism::backend {

// Runs `release` (which drops references) unless the interpreter is about to finalize; returns
// whether it ran. The caller must then leak what it holds, never destroy it.
bool release_unless_exiting(const std::function<void()>& release);

// Called once by the atexit hook, with the GIL released: waits for a release in progress, then
// closes the gate for good.
void close_release_gate();

}  // namespace prism::backend
