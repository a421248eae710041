"""The package's layers (docs/architecture.md): imports only go downwards (core < adapters < harness), the
core never imports vLLM, the two adapter lines never import each other, and no module-level import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "peagle_vllm"
HARNESS = ("peagle_vllm.harness", "peagle_vllm.cli")
ADAPTERS = ("peagle_vllm.vllm_adapter", "peagle_vllm.plugin")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, module: str, top_level_only: bool) -> set[str]:
    """Absolute names imported by a module (relative imports resolved); with `top_level_only`, only the
    imports that run when the module is imported (not those inside functions)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # `if TYPE_CHECKING:` and try/except blocks at module level run at import too
        nodes = [n for top in tree.body for n in ast.walk(top) if not isinstance(top, (ast.FunctionDef, ast.ClassDef))]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join(package + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _layer(module: str) -> int:
    if module.startswith(HARNESS):
        return 2
    if module.startswith(ADAPTERS):
        return 1
    return 0


def test_imports_only_go_downwards_and_the_core_never_imports_vllm() -> None:
    problems = []
    for module, path in _modules().items():
        for name in _imports(path, module, top_level_only=False):
            if name == "vllm" or name.startswith("vllm."):
                if _layer(module) == 0:
                    problems.append(f"{module} (core) imports {name}")
            elif name.startswith("peagle_vllm.") and _layer(name) > _layer(module):
                problems.append(f"{module} imports {name}, a higher layer")
            elif module.startswith("peagle_vllm.vllm_adapter.v1") and name.startswith("peagle_vllm.vllm_adapter.v2") \
                    or module.startswith("peagle_vllm.vllm_adapter.v2") and name.startswith("peagle_vllm.vllm_adapter.v1"):
                problems.append(f"{module} imports {name}: the adapter lines stand apart")
    assert not problems, "\n".join(problems)


def test_no_module_level_import_cycle() -> None:
    modules = _modules()
    graph = {m: {n for n in _imports(p, m, top_level_only=True) if n in modules and n != m} for m, p in modules.items()}
    # a package's __init__ importing its own submodules is no cycle of ideas; submodules importing it back is
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]) if nxt in trail else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(cycles)


def test_no_module_is_over_400_lines() -> None:
    long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
