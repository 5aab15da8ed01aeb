"""Imports flow one way (docs/architecture.md): grammars <- dsl <- plan <- {compiler, runner}
<- cluster; the runtime imports none of them; no two modules of durapipe import each other."""

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


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _module_graph() -> dict[str, set[str]]:
    """Module -> the modules of durapipe it imports by name, at the top or inside a function
    (a deferred import still ties the two together); ``from durapipe.x import y`` is an edge to
    ``durapipe.x.y`` when that is a module, else to ``durapipe.x``.  The implicit import of a
    package's ``__init__`` is not an edge: every module would then sit in its package's cycle."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = (".".join([*base, node.module] if node.module else base)
                          if node.level else node.module or "")
                for alias in node.names:
                    target = f"{module}.{alias.name}"
                    edges.add(target if target in MODULES else module)
            elif isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
        graph[name] = {edge for edge in edges if edge in MODULES} - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = [stack.pop()]
            while component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_inside_durapipe() -> None:
    """Two modules that import each other are one concern split in two, or two concerns
    tangled (``cli``/``diagram.cli``, ``dsl.builder``/``dsl.load``, ``runtime.checkpoint``/
    ``runtime.sdk`` were); either way, one of them belongs below the other."""
    assert _cycles(_module_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_argo_lowering_has_its_stage_lowering_above_the_jobset() -> None:
    graph = _module_graph()
    assert "durapipe.compiler.argo_jobset" in graph["durapipe.compiler.argo_stage"]
    assert "durapipe.compiler.argo_stage" not in graph["durapipe.compiler.argo_jobset"]


#: docs/architecture.md's layers: what each part of durapipe may import (``__init__``: the
#: package's version, ``files``: its file helpers).  The CLI, above them all, is imported by
#: none of them.
LAYERS = {
    "runtime": {"__init__"},
    "grammars": set(),
    "dsl": {"__init__", "files", "grammars"},
    "plan": {"dsl", "runtime"},
    "compiler": {"__init__", "files", "dsl", "plan", "runtime"},
    "runner": {"__init__", "files", "dsl", "plan", "compiler", "runtime"},
    "cluster": {"__init__", "files", "extras", "dsl", "plan", "compiler", "runtime"},
    "diagram": {"__init__", "files", "dsl", "plan", "compiler"},
    "lsp": {"__init__", "files", "grammars", "dsl", "plan", "compiler", "diagram"},
    "files": set(),
    # How to install an optional extra: the words of the "missing extra" messages.
    "extras": set(),
    # Shell completion scripts, made from the CLI's parser, which the CLI hands it.
    "completion": set(),
}


def test_each_part_imports_only_the_layers_below_it() -> None:
    reached: dict[str, set[str]] = {}
    for module, edges in _module_graph().items():
        part = module.split(".")[1] if "." in module else "__init__"
        reached.setdefault(part, set()).update(
            edge.split(".")[1] if "." in edge else "__init__" for edge in edges)
    assert set(LAYERS) | {"__init__", "__main__", "cli"} == set(reached) | {"grammars"}
    for part, allowed in LAYERS.items():
        assert reached.get(part, set()) - {part} <= allowed, part
    assert not any("cli" in reached[part] for part in LAYERS if part in reached)


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
