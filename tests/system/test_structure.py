"""The package's shape: it is laid out by stage like the workflow's rules, each stage imports
only the stages below it (counting the imports inside functions too), no module imports
itself in a cycle, and modules stay small enough to read."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "src" / "tokenflip"

# Modules allowed above MAX_LINES, each with the reason.
MAX_LINES = 400
LONG_MODULES = {
}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module → the package's modules it imports, at module level or inside functions."""
    root = package_dir.parent
    modules = {_module_name(p, root): p for p in package_dir.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    deps.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walker_finds_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import x\n")
    (pkg / "sub" / "a.py").write_text("from .b import y\nx = 1\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..sub.a import x\n    return x\ny = 2\n")
    (pkg / "c.py").write_text("from . import sub\n")
    assert cycles(import_graph(pkg)) == [["pkg.sub.a", "pkg.sub.b"]]


# The stages, lowest first; a module imports only from its own stage and those before it.
# The study sits above run: validating a config reads the engines', benchmarks', probes'
# and interventions' registries.
STAGES = ("core", "models", "run", "study", "analysis", "report", "cli")
# What may stand at the top level beside the stage packages: the workflow (Snakefile, rules,
# report caption, profiles: no Python module) ships inside the package.
TOP_LEVEL = {"__init__.py", "__main__.py", "workflow"}


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a later stage than its own: "a (run) -> b (analysis)"."""
    found = []
    for module, deps in sorted(graph.items()):
        own = stage_of(module)
        for dep in sorted(deps):
            theirs = stage_of(dep)
            if own and theirs and STAGES.index(theirs) > STAGES.index(own):
                found.append(f"{module} ({own}) -> {dep} ({theirs})")
    return found


def test_the_package_is_laid_out_by_stage():
    top = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    assert top == TOP_LEVEL | set(STAGES), top ^ (TOP_LEVEL | set(STAGES))
    assert len([name for name in top if name.endswith(".py")]) <= 8
    assert all((PACKAGE / stage / "__init__.py").is_file() for stage in STAGES)


def test_each_stage_imports_only_the_stages_below_it():
    assert upward_imports(import_graph(PACKAGE)) == []


def test_the_layer_check_finds_an_upward_import_inside_a_function(tmp_path):
    pkg = tmp_path / "tokenflip"
    for stage in ("core", "run", "analysis"):
        (pkg / stage).mkdir(parents=True)
        (pkg / stage / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "analysis" / "compare.py").write_text("from tokenflip.core import specs\n")
    (pkg / "core" / "specs.py").write_text("x = 1\n")
    (pkg / "run" / "cell.py").write_text("def f():\n    from tokenflip.analysis.compare import specs\n")
    assert upward_imports(import_graph(pkg)) == ["tokenflip.run.cell (run) -> tokenflip.analysis.compare (analysis)"]


def test_the_package_imports_itself_by_absolute_names():
    """One way to write an import of the package: `from tokenflip.<stage>.<module> import`,
    so that a module's stage reads in its imports."""
    relative = [f"{p.relative_to(PACKAGE)}:{node.lineno}" for p in PACKAGE.rglob("*.py")
                for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom) and node.level]
    assert relative == []


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert "tokenflip.run.benchmarks.sources" in graph["tokenflip.run.benchmarks.base"]  # the walker sees the package
    assert cycles(graph) == []


def unresolved_relative_imports(package_dir: Path) -> list[str]:
    """Relative imports (at module level or inside functions) that name no module of the
    package: a function-level one fails only when that function runs."""
    root = package_dir.parent
    modules = {_module_name(p, root) for p in package_dir.rglob("*.py")}
    missing = []
    for path in package_dir.rglob("*.py"):
        name = _module_name(path, root)
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                target = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                if target not in modules:
                    missing.append(f"{path.relative_to(root)}:{node.lineno}: {'.' * node.level}{node.module or ''}")
    return missing


def test_every_relative_import_names_a_module_of_the_package(tmp_path):
    assert unresolved_relative_imports(PACKAGE) == []
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from .gone import x\n    from ..sub import a\n")
    assert unresolved_relative_imports(pkg) == ["pkg/sub/a.py:2: .gone"]


def test_the_sandbox_knows_nothing_about_benchmarks():
    graph = import_graph(PACKAGE)
    sandbox = [m for m in graph if m.startswith("tokenflip.run.sandbox")]
    assert {"tokenflip.run.sandbox.execution", "tokenflip.run.sandbox.bwrap"} <= set(sandbox)
    assert not {d for m in sandbox for d in graph[m] if not d.startswith("tokenflip.run.sandbox")}


def test_modules_stay_short_or_say_why():
    long = {str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines())
            for p in PACKAGE.rglob("*.py")}
    over = {name: n for name, n in long.items() if n > MAX_LINES}
    assert set(over) <= set(LONG_MODULES), {name: n for name, n in over.items() if name not in LONG_MODULES}
    stale = set(LONG_MODULES) - set(over)
    assert not stale, f"now short, remove from LONG_MODULES: {stale}"
