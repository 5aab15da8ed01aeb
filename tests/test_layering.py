"""Imports flow one way: grammars <- dsl <- compiler; the runtime imports neither."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "durapipe"


def _imports(part: str) -> set[str]:
    found: set[str] = set()
    for path in (PACKAGE / part).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                # `from durapipe.runtime import contract` imports durapipe.runtime.contract.
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return found


PARTS = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}


def _durapipe_parts(modules: set[str]) -> set[str]:
    """The subpackages of durapipe that ``modules`` reach (``durapipe.__version__`` is none)."""
    return {m.split(".")[1] for m in modules if m.startswith("durapipe.")} & PARTS


def test_the_parts_exist() -> None:
    assert {"grammars", "dsl", "compiler", "runtime"} <= PARTS


def test_runtime_imports_neither_dsl_nor_compiler() -> None:
    assert _durapipe_parts(_imports("runtime")) <= {"runtime"}


def test_dsl_does_not_import_compiler_or_runtime() -> None:
    assert _durapipe_parts(_imports("dsl")) <= {"dsl", "grammars"}


def test_compiler_reads_only_the_runtime_contract() -> None:
    runtime_parts = {m.split(".")[2] for m in _imports("compiler")
                     if m.startswith("durapipe.runtime.")}
    # build_zipapp: the compiler ships the runtime (a ConfigMap in its output), so it packages
    # it; it imports no runtime behaviour.
    assert runtime_parts <= {"contract", "cachekey", "build_zipapp"}


def _modules_loaded_by(*argv: str) -> set[str]:
    """The top-level packages a fresh ``durapipe ARGV`` process has imported when it ends."""
    import subprocess
    import sys

    probe = ("import sys, durapipe.cli\n"
             "code = durapipe.cli.main(sys.argv[1:])\n"
             "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
             "raise SystemExit(code)")
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True,
                          text=True, check=True, cwd=PACKAGE.parent)
    return set(done.stdout.split("\n")[-2].split())


def test_check_and_compile_import_no_validation_library_and_not_hera() -> None:
    """Their cold start is a target (issues 2 and 3): pydantic's class building alone cost
    more than the whole budget's margin, and hera is a comparison, not a dependency."""
    for argv in (("check", "examples/prep_train_eval.pipe"),
                 ("compile", "examples/prep_train_eval.pipe", "-o", "/dev/null")):
        loaded = _modules_loaded_by(*argv)
        assert "durapipe" in loaded and "lark" in loaded
        assert not loaded & {"pydantic", "pydantic_core", "hera", "yaml"}, argv
        # The language server's library is for `durapipe lsp` alone (issue 14).
        assert not loaded & {"pygls", "lsprotocol", "cattrs"}, argv
        # The cluster client is for `durapipe submit/status/watch` alone (issue 12).
        assert not loaded & {"kubernetes", "urllib3"}, argv


def test_only_the_cluster_module_imports_the_kubernetes_client() -> None:
    """The runtime stays standard-library only and the dsl never talks to a cluster: the
    `cluster` extra is optional, imported by one module (cluster/api.py) when a command runs."""
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top_level = {alias.name.split(".")[0] for node in tree.body
                     if isinstance(node, ast.Import) for alias in node.names}
        top_level |= {node.module.split(".")[0] for node in tree.body
                      if isinstance(node, ast.ImportFrom) and node.module}
        assert "kubernetes" not in top_level, path
        if path.relative_to(PACKAGE).as_posix() != "cluster/api.py":
            assert "kubernetes" not in {m.split(".")[0] for m in _module_imports(path)}, path


def test_only_the_server_module_imports_the_lsp_library() -> None:
    """The analysis behind `durapipe lsp` stays usable (and testable) without pygls."""
    for path in (PACKAGE / "lsp").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {alias.name.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module.split(".")[0] for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.module}
        if path.name != "server.py":
            assert not names & {"pygls", "lsprotocol"}, path.name


def _module_imports(path: Path) -> set[str]:
    """Modules of durapipe one file imports, at the top or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_runner_imports_no_argo_lowering() -> None:
    """`durapipe run` executes the stage plan; Argo's objects are the other executor."""
    compiler_modules = {m.split(".")[2] for m in _imports("runner")
                        if m.startswith("durapipe.compiler.")}
    assert compiler_modules, "the runner reads the plan"
    assert compiler_modules <= {"plan", "memo"}, compiler_modules


def test_no_import_cycle_inside_the_compiler() -> None:
    names = {p.stem for p in (PACKAGE / "compiler").glob("*.py")} - {"__init__"}
    graph = {
        name: {m.split(".")[2] for m in _module_imports(PACKAGE / "compiler" / f"{name}.py")
               if m.startswith("durapipe.compiler.") and m.split(".")[2] in names} - {name}
        for name in names
    }
    # Depth-first search for a back edge.
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            assert state.get(nxt) != "open", " -> ".join([*path, node, nxt])
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert graph["argo_stage"] and "argo_stage" not in graph["argo_jobset"]


def test_the_cluster_layer_sits_above_the_compiler() -> None:
    """`durapipe submit/status/watch` read what the compiler wrote (its names and markers) and
    compile before submitting; the compiler, the dsl and the runtime never talk to a cluster."""
    assert _durapipe_parts(_imports("cluster")) <= {"cluster", "compiler", "dsl", "runtime"}
    for part in ("compiler", "dsl", "runtime", "runner"):
        assert "cluster" not in _durapipe_parts(_imports(part)), part


def test_the_plan_reads_the_model_and_the_runtime_contract_only() -> None:
    """``dsl -> plan -> {compiler, runner}``: the retry machine knows no executor."""
    assert _durapipe_parts(_imports("plan")) <= {"plan", "dsl", "runtime"}
    runtime_parts = {m.split(".")[2] for m in _imports("plan") if m.startswith("durapipe.runtime.")}
    assert runtime_parts <= {"contract"}
    assert "plan" in _durapipe_parts(_imports("compiler"))
    assert "plan" in _durapipe_parts(_imports("runner"))


#: The longest a function of the compiler or the runner may be (the house rule).
MAX_FUNCTION_LINES = 60


def test_no_compiler_or_runner_function_is_over_60_lines() -> None:
    """A function's lines from its `def` to its last line, nested functions included in the
    one that holds them (and counted again on their own)."""
    too_long = []
    for part in ("compiler", "runner"):
        for path in sorted((PACKAGE / part).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    assert node.end_lineno is not None
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        where = path.relative_to(PACKAGE.parent).as_posix()
                        too_long.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    assert not too_long, "split these: " + "; ".join(too_long)
