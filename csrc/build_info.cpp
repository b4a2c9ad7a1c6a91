// Build facts a bug report needs: compiler, the torch it was built against, the layout probes.
#include "registry.h"

#include <torch/version.h>

#include "abi_probe.h"

#ifndef PRISM_BUILD_TORCH_VERSION
#define PRISM_BUILD_TORCH_VERSION TORCH_VERSION
#endif

namespace {

void bind(pybind11::module_& m) {
  // The full version of the torch this module was built against ("2.13.0+cpu"); module init
  // refuses any other torch (module.cpp).
  m.attr("torch_version") = PRISM_BUILD_TORCH_VERSION;
  m.attr("torch_header_version") = TORCH_VERSION;
#if defined(__clang__)
  m.attr("compiler") = "clang " __clang_version__;
#elif defined(__GNUC__)
  m.attr("compiler") = "gcc " __VERSION__;
#else
  m.attr("compiler") = "unknown";
#endif
  m.def(
      "layout_probes",
      [] {
        pybind11::list out;
        for (const auto& probe : prism::abi::probes()) {
          out.append(pybind11::make_tuple(probe.type, probe.unit, probe.size_bytes, probe.align_bytes));
        }
        return out;
      },
      "(class, translation unit, sizeof, alignof) as each unit compiled the probed classes (abi_probe.h); "
      "module init checked that the units agree.");
}

}  // namespace

PRISM_SUBMODULE(build_info, bind);
