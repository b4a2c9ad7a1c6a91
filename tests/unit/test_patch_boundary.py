"""Every change to Megatron or torch is a record of `prism_megatron.patches`: nothing else assigns.

The scan reads every module of the package outside `patches/` and fails on an assignment (or `del`)
to an attribute of a name imported from torch or megatron (`torch.cuda.current_device = ...`,
`_mla.HAVE_TE = ...`, `DistributedOptimizer.x = ...`) and on `setattr`/`delattr` on such a name. An
attribute of an object the module did not import by name (an instance megatron-core built) cannot be
told apart statically; review catches those.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "prism_megatron"
FOREIGN_ROOTS = ("torch", "megatron")

ALLOWED = {
    ("backend/activation.py", "delattr(dist.Backend, key)"): "undoes what torch's register_backend added "
    "(backend registration is torch's extension point, ARCHITECTURE.md decision 2; torch has no unregister)",
}
"""(module, statement) -> why it is not a patch."""


def foreign_names(tree: ast.AST) -> set[str]:
    """Names a module bound to torch or megatron objects by importing them."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FOREIGN_ROOTS:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] in FOREIGN_ROOTS
        ):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def assigned_targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign | ast.Delete):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    else:
        return []
    flat = []
    for target in targets:
        flat += target.elts if isinstance(target, ast.Tuple | ast.List) else [target]
    return flat


def assignments_to_foreign_attributes(source: str) -> list[str]:
    tree = ast.parse(source)
    foreign = foreign_names(tree)
    found = []
    for node in ast.walk(tree):
        for target in assigned_targets(node):
            if isinstance(target, ast.Attribute) and root_name(target) in foreign:
                found.append(ast.unparse(target))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
            and root_name(node.args[0]) in foreign
        ):
            found.append(ast.unparse(node))
    return found


def test_the_scan_finds_each_form_of_assignment():
    source = (
        "import torch\nimport megatron.core.parallel_state as ps\n"
        "from megatron.core.transformer import multi_latent_attention as _mla\n"
        "from megatron.core.optimizer import DistributedOptimizer\n"
        "torch.cuda.current_device = lambda: 'meta'\n"
        "_mla.HAVE_TE = False\n"
        "torch.Tensor.cuda, x = None, 1\n"
        "DistributedOptimizer.step += 1\n"
        "del ps.create_group\n"
        "setattr(torch.cuda, 'synchronize', None)\n"
        "obj = object(); obj.attr = 1\n"  # not an imported name: not found
    )
    assert assignments_to_foreign_attributes(source) == [
        "torch.cuda.current_device",
        "_mla.HAVE_TE",
        "torch.Tensor.cuda",
        "DistributedOptimizer.step",
        "ps.create_group",
        "setattr(torch.cuda, 'synchronize', None)",
    ]


def test_no_module_outside_patches_assigns_to_a_megatron_or_torch_attribute():
    offences = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module.startswith("patches/"):
            continue
        for statement in assignments_to_foreign_attributes(path.read_text(encoding="utf-8")):
            if (module, statement) not in ALLOWED:
                offences.append(f"{module}: {statement}")
    assert offences == [], "make these records of prism_megatron.patches (registry.Patch):\n" + "\n".join(
        offences
    )
