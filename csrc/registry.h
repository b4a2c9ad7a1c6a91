// One extension module, many components: each component's translation unit registers a function
// that adds its bindings to a submodule of prism_megatron._C, so adding a component never edits a
// shared file. Registration happens in static initialisers, before the module's init runs.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace prism {

using Registrar = std::function<void(pybind11::module_&)>;

// Registered (submodule name, registrar) pairs, in registration order.
std::vector<std::pair<std::string, Registrar>>& registrars();

struct RegisterSubmodule {
  RegisterSubmodule(const char* name, Registrar fn) { registrars().emplace_back(name, std::move(fn)); }
};

}  // namespace prism

// PRISM_SUBMODULE(replay, [](pybind11::module_& m) { m.def(...); });
// adds prism_megatron._C.replay with the bindings the lambda defines.
#define PRISM_SUBMODULE(name, fn) \
  static ::prism::RegisterSubmodule prism_register_##name(#name, fn)
