// The prism_megatron._C extension: collects every component's submodule (see registry.h), after
// two checks that turn a broken build into an ImportError instead of a crash far away:
//   - its translation units agree on the layout of every probed class (abi_probe.h): objects of
//     different source versions were not linked together;
//   - the torch importing it is the torch it was built against (setup.py records that one's
//     version): a c10d::Backend subclass compiled against one torch's headers and run on another's
//     library can differ in its virtual methods and members.
#include "registry.h"

#include <torch/version.h>

#include <map>
#include <sstream>
#include <string>

#include "abi_probe.h"

// setup.py defines the full version of the torch it builds with ("2.13.0+cpu"); a build without it
// knows the header's numbered version only ("2.13.0"), and is compared on that.
#ifndef PRISM_BUILD_TORCH_VERSION
#define PRISM_BUILD_TORCH_VERSION TORCH_VERSION
#endif

namespace py = pybind11;

namespace prism {

std::vector<std::pair<std::string, Registrar>>& registrars() {
  static std::vector<std::pair<std::string, Registrar>> list;
  return list;
}

namespace abi {

std::vector<Probe>& probes() {
  static std::vector<Probe> list;
  return list;
}

}  // namespace abi

namespace {

// "csrc/backend/backend.cpp" from the path the compiler was given (absolute in ninja builds).
std::string unit_name(const std::string& path) {
  const auto at = path.rfind("csrc/");
  return at == std::string::npos ? path : path.substr(at);
}

// Empty when every probed class has one layout across the units; else the first disagreement.
std::string layout_disagreement() {
  std::map<std::string, const abi::Probe*> first_of;
  for (const auto& probe : abi::probes()) {
    auto [it, inserted] = first_of.emplace(probe.type, &probe);
    const abi::Probe& first = *it->second;
    if (inserted || (first.size_bytes == probe.size_bytes && first.align_bytes == probe.align_bytes)) {
      continue;
    }
    std::ostringstream out;
    out << "prism_megatron._C: its objects disagree on the layout of " << probe.type << ": "
        << unit_name(first.unit) << " compiled it as " << first.size_bytes << " bytes (align "
        << first.align_bytes << "), " << unit_name(probe.unit) << " as " << probe.size_bytes << " bytes (align "
        << probe.align_bytes << "). The build linked objects of different source versions (a reused build "
        << "folder); rebuild from empty build folders: make clean && make build (or python -m tools.native_build)";
    return out.str();
  }
  return {};
}

// The public part of a version ("2.13.0" of "2.13.0+cpu").
std::string public_version(const std::string& version) { return version.substr(0, version.find('+')); }

void check_torch(const std::string& built_with) {
  const py::module_ torch = py::module_::import("torch");
  const auto running = py::str(torch.attr("__version__")).cast<std::string>();
  const bool local_known = built_with.find('+') != std::string::npos;
  if (running == built_with || (!local_known && public_version(running) == built_with)) {
    return;
  }
  const auto where = py::hasattr(torch, "__file__") ? py::str(torch.attr("__file__")).cast<std::string>() : "?";
  throw py::import_error("prism_megatron._C was built against torch " + built_with + " but is imported by torch " +
                         running + " (" + where + "); rebuild it with this torch: make build, or python setup.py " +
                         "build_ext --inplace --force with this interpreter");
}

}  // namespace
}  // namespace prism

PYBIND11_MODULE(_C, m) {
  const std::string disagreement = prism::layout_disagreement();
  if (!disagreement.empty()) {
    throw py::import_error(disagreement);
  }
  prism::check_torch(PRISM_BUILD_TORCH_VERSION);
  m.doc() = "prism-megatron native core: c10d backend, replay engine, simulator core";
#ifdef PRISM_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  for (auto& [name, fn] : prism::registrars()) {
    auto sub = m.def_submodule(name.c_str());
    fn(sub);
  }
}
