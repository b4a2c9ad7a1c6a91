"""Build and check tooling of prism-megatron, run from the repository root as ``python -m tools.X``.

- ``native_build``: forced builds of ``prism_megatron._C`` from empty build folders (every GPU build,
  ``make cuda-check``), whole or in parts;
- ``build_smoke``: activate the prism backend on a built module and run collectives with it;
- ``build_env``: what a build links against (interpreter, torch, compiler and link flags), recorded
  before a GPU run builds anything.

Not part of the installed package: nothing under ``prism_megatron`` imports these.
"""
