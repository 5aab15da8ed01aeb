"""The runtime stays cheap to import and ships as a self-contained zipapp."""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
import tokenize
import zipfile
from pathlib import Path
from typing import Any

from durapipe.runtime import contract
from durapipe.runtime.build_zipapp import build
from durapipe.runtime.hashing import hash_path
from durapipe.runtime.verdict import parse_verdict_line
from tests.runtime.runtime_helpers import REPO_ROOT, child_env


def test_importing_the_runtime_loads_only_the_standard_library() -> None:
    code = (
        "import sys, json\n"
        "before = set(sys.modules)\n"
        "import durapipe.runtime, durapipe.runtime.contract, durapipe.runtime.cachekey\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, check=True
    ).stdout
    loaded = json.loads(out)
    third_party = [
        name
        for name in loaded
        if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] != "durapipe"
    ]
    assert third_party == []
    assert not [n for n in loaded if n.startswith(("durapipe.dsl", "durapipe.compiler"))]


def test_zipapp_runs_the_wrapper_without_the_source_tree(tmp_path: Path) -> None:
    archive = build(tmp_path / "bin" / contract.RUNTIME_ZIPAPP_NAME)
    names = zipfile.ZipFile(archive).namelist()
    assert "__main__.py" in names and "durapipe/runtime/wrapper.py" in names
    assert not [n for n in names if n.startswith(("durapipe/dsl", "durapipe/compiler"))]

    # A bare environment in another directory: nothing but the archive provides durapipe.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    log = tmp_path / "log"
    output = tmp_path / "out.txt"
    env[contract.ENV_OUTPUTS] = json.dumps({"result": str(output)})
    env[contract.ENV_OUTPUT_HASH_DIR] = str(tmp_path / "hashes")
    completed = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(archive),
            "exec",
            "--termination-log",
            str(log),
            "--",
            sys.executable,
            "-c",
            f"open({str(output)!r}, 'w').write('done')",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    verdict, _ = parse_verdict_line(log.read_text().strip())
    assert verdict == contract.VERDICT_SUCCESS
    # -S hides site-packages (blake3, an installed durapipe): the archive is all there is,
    # and it hashed with the stdlib fallback.
    assert (tmp_path / "hashes" / "result.hash").read_text() == hash_path(output, "sha256")


def test_build_zipapp_command_line(tmp_path: Path) -> None:
    target = tmp_path / "rt.pyz"
    subprocess.run(
        [sys.executable, "-m", "durapipe.runtime.build_zipapp", str(target)],
        env=child_env(),
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    assert zipfile.is_zipfile(target)


def test_user_code_imports_the_runtime_from_the_zipapp_with_nothing_installed(
    tmp_path: Path,
) -> None:
    # What a pod whose image has only Python does: the trainer imports durapipe.runtime, and
    # the archive is the only durapipe there is (-S: no site-packages for the child either).
    archive = build(tmp_path / "bin" / contract.RUNTIME_ZIPAPP_NAME)
    trainer = tmp_path / "train.py"
    trainer.write_text(
        "import durapipe.runtime, sys\n"
        "from durapipe.runtime import contract\n"
        "print(durapipe.runtime.__file__, file=sys.stderr)\n"
        "open('where.txt', 'w').write(durapipe.runtime.__file__)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": "/opt/user-libs"}
    log = tmp_path / "log"
    completed = subprocess.run(
        [sys.executable, "-I", "-S", str(archive), "exec", "--termination-log", str(log), "--",
         sys.executable, "-S", str(trainer)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    verdict, _ = parse_verdict_line(log.read_text().strip())
    assert verdict == contract.VERDICT_SUCCESS
    assert (tmp_path / "where.txt").read_text() == str(
        archive / "durapipe" / "runtime" / "__init__.py")


def test_an_installed_runtime_leaves_the_childs_python_path_alone() -> None:
    from durapipe.runtime.wrapper import runtime_archive, with_runtime_importable

    assert runtime_archive() is None
    assert with_runtime_importable({"PYTHONPATH": "/a"}) == {"PYTHONPATH": "/a"}
    assert "PYTHONPATH" not in with_runtime_importable({})


def test_the_archive_blanks_comments_and_docstrings_and_keeps_every_line() -> None:
    """So a traceback from a pod names the repository's lines, and the archive stays small."""
    from durapipe.runtime import build_zipapp

    runtime = Path(build_zipapp.__file__).parent
    archived = build_zipapp.sources()
    for name, data in archived.items():
        if not name.startswith("durapipe/runtime/"):
            continue
        original = (runtime / name.removeprefix("durapipe/runtime/")).read_bytes()
        assert data.count(b"\n") == original.count(b"\n"), name
        tree = ast.parse(data)
        # The same code: only docstrings (now empty) and comments differ.
        assert ast.dump(_without_docstrings(ast.parse(original))) == ast.dump(
            _without_docstrings(tree)), name
        assert not [t for t in tokenize.generate_tokens(io.StringIO(data.decode()).readline)
                    if t.type == tokenize.COMMENT], name
    # The one docstring the runtime reads (its --help) is kept.
    main_source = archived["durapipe/runtime/__main__.py"].decode()
    assert ast.get_docstring(ast.parse(main_source))
    sample = b'def f():\n    """Doc\n    more."""\n    x = 1  # why\n    return "# kept"\n'
    assert build_zipapp.stripped(sample) == b'def f():\n    ""\n\n    x = 1\n    return "# kept"\n'


def _without_docstrings(tree: Any) -> Any:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                getattr(body[0], "value", None), ast.Constant) and isinstance(
                body[0].value.value, str):
            body[0].value.value = ""
    return tree
