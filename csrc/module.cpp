// The prism_megatron._C extension: collects every component's submodule (see registry.h).
#include "registry.h"

namespace prism {

std::vector<std::pair<std::string, Registrar>>& registrars() {
  static std::vector<std::pair<std::string, Registrar>> list;
  return list;
}

}  // namespace prism

PYBIND11_MODULE(_C, m) {
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
