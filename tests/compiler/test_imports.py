"""The compiler's import graph: a plan loads without the renderer, and nothing imports late.

Layers, bottom up: ``dialect`` (sqlglot only) ← ``types``, ``scalar`` ← ``ir``, ``program``
← ``queries`` (h, a, Δ) ← ``plan`` ← ``sqlgen`` (the rest of the SQL) and the passes ←
the package (``compile_program``) ← ``explain``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPILER = ROOT / "incr" / "compiler"


def _modules() -> dict[str, Path]:
    """Every module of incr.compiler, by dotted name."""
    out = {}
    for path in sorted(COMPILER.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(node: ast.Import | ast.ImportFrom, module: str, path: Path) -> list[str]:
    """Absolute names a statement imports (for ``from X import a``: ``X.a`` and ``X``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    return [f"{base}.{a.name}" for a in node.names] + [base]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path) -> tuple[set[str], list[str]]:
    """(incr.compiler modules imported when the module runs, late imports of incr.compiler).

    Run-time imports are the module-level ones outside ``if TYPE_CHECKING:``; late ones are
    any import inside a function or class body.
    """
    tree = ast.parse(path.read_text(), str(path))
    known = _modules()
    eager: set[str] = set()
    late: list[str] = []

    def visit(node: ast.AST, nested: bool, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                names = [n for n in _imported(child, module, path) if n.startswith("incr.compiler")]
                if nested and names:
                    late.append(f"{path.relative_to(ROOT)}:{child.lineno} imports {names[-1]}")
                elif not typing_only:
                    # ``from incr.compiler import iterate`` reads a submodule; otherwise the package.
                    eager.update(n for n in names if n in known)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                visit(child, True, typing_only)
            elif isinstance(child, ast.If) and not nested and _is_type_checking(child.test):
                visit(child, nested, True)
            else:
                visit(child, nested, typing_only)

    visit(tree, False, False)
    eager.discard(module)
    return eager, late


def test_plan_imports_without_the_renderer() -> None:
    code = ("import sys, incr.compiler.plan\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('incr.') "
            "or m.split('.')[0] in ('pyspark', 'deltalake', 'airflow', 'matplotlib'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=ROOT).stdout.split()
    assert "incr.compiler.plan" in loaded
    assert "incr.compiler.sqlgen" not in loaded
    assert "incr.compiler.explain" not in loaded
    # The compiler is pure Python + sqlglot: nothing of the runtime's engines or the extras.
    assert not [m for m in loaded if not m.startswith("incr.compiler") and m not in (
        "incr", "incr.errors", "incr.algebra", "incr.algebra.monoids", "incr.algebra.exact")], loaded


def test_no_late_imports_inside_the_compiler() -> None:
    late = [line for module, path in _modules().items() for line in _imports(module, path)[1]]
    assert not late, "imports of incr.compiler inside a function or class:\n" + "\n".join(late)


def test_compiler_import_graph_has_no_cycle() -> None:
    graph = {module: _imports(module, path)[0] for module, path in _modules().items()}
    # Importing a submodule runs its package first; that is an edge the other way round
    # only for the package's own ``from incr.compiler.x import``, so it is not added here.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                pytest.fail("import cycle: " + " -> ".join([*stack[stack.index(dep):], dep]))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_dialect_module_is_a_leaf() -> None:
    eager, _ = _imports("incr.compiler.dialect", COMPILER / "dialect.py")
    assert eager <= {"incr.compiler.duckdb_calls", "incr.compiler.duckdb_scalars"}
    assert _imports("incr.compiler.duckdb_scalars", COMPILER / "duckdb_scalars.py")[0] \
        <= {"incr.compiler.duckdb_calls"}
    assert _imports("incr.compiler.duckdb_calls", COMPILER / "duckdb_calls.py")[0] \
        <= {"incr.compiler.patterns"}
    assert _imports("incr.compiler.patterns", COMPILER / "patterns.py")[0] == set()
    for module in ("incr.compiler.plan", "incr.compiler.queries", "incr.compiler.scalar"):
        assert "incr.compiler.sqlgen" not in _imports(module, _modules()[module])[0]


def test_the_core_imports_no_optional_extra_at_module_level() -> None:
    """apache-airflow and matplotlib are extras (pyproject): the core must load without them."""
    core = [ROOT / "incr" / "cli.py", ROOT / "incr" / "errors.py", ROOT / "incr" / "oracle.py",
            *sorted((ROOT / "incr" / "compiler").rglob("*.py")),
            *sorted((ROOT / "incr" / "algebra").rglob("*.py")),
            *sorted((ROOT / "incr" / "runtime").rglob("*.py"))]
    found = []
    for path in core:
        for node in ast.parse(path.read_text(), str(path)).body:  # module level only
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in ("airflow", "matplotlib")]
    assert not found, found
