// Layout probes: every translation unit that includes a header with PRISM_ABI_PROBE(name, T)
// records sizeof(T) and alignof(T) as that unit compiled them, and the module's init (module.cpp)
// refuses to load when two units disagree.
//
// Why: an object compiled against an older copy of a header (left in a reused build folder) still
// links, and then allocates or reads a class with another layout. The result is heap corruption far
// from its cause: the segmentation fault of the first GPU run (a PrismBackend member added in
// backend.h; the object that allocates the backend was not recompiled). A probe turns any such mix
// into an ImportError that names the class and the disagreeing units.
//
// Light: the standard library only, so any header may use it.
#pragma once

#include <cstddef>
#include <vector>

namespace prism::abi {

struct Probe {
  const char* type;  // the name given to PRISM_ABI_PROBE
  const char* unit;  // the translation unit's main source file, as the compiler was given it
  std::size_t size_bytes;
  std::size_t align_bytes;
};

// Every probe of the loaded module, in static-initialisation order (defined in module.cpp).
std::vector<Probe>& probes();

inline bool record(const char* type, const char* unit, std::size_t size_bytes, std::size_t align_bytes) {
  probes().push_back({type, unit, size_bytes, align_bytes});
  return true;
}

}  // namespace prism::abi

// The unit's own source file (a header's __FILE__ would name the header).
#if defined(__GNUC__) || defined(__clang__)
#define PRISM_ABI_UNIT __BASE_FILE__
#else
#define PRISM_ABI_UNIT __FILE__
#endif

// At global scope, after T is complete: PRISM_ABI_PROBE(PrismBackend, ::prism::backend::PrismBackend)
// One variable per including unit (an unnamed namespace), initialised before the module's init runs.
#define PRISM_ABI_PROBE(name, ...)                                                                    \
  namespace {                                                                                         \
  [[maybe_unused]] const bool prism_abi_probe_##name =                                                \
      ::prism::abi::record(#name, PRISM_ABI_UNIT, sizeof(__VA_ARGS__), alignof(__VA_ARGS__));         \
  }
