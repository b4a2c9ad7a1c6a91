// Build facts a bug report needs: compiler and the torch it was built against.
#include "registry.h"

#include <torch/version.h>

namespace {

void bind(pybind11::module_& m) {
  m.attr("torch_version") = TORCH_VERSION;
#if defined(__clang__)
  m.attr("compiler") = "clang " __clang_version__;
#elif defined(__GNUC__)
  m.attr("compiler") = "gcc " __VERSION__;
#else
  m.attr("compiler") = "unknown";
#endif
}

}  // namespace

PRISM_SUBMODULE(build_info, bind);
