"""Writing a file so that a reader, or a crash, sees the old content or the new, never half."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path | None:
    """``$XDG_CACHE_HOME/durapipe`` (``~/.cache/durapipe``), created; ``None`` where it cannot
    be (a read-only home): every cache in it is an optimisation, never needed."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = Path(base) / "durapipe"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return directory


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, durable: bool = True) -> None:
    """Replace ``path`` by write-then-rename in its own directory, keeping its mode.

    ``durable`` also survives power loss (fsync before the rename); state that is superseded
    within seconds may skip it.  A device or pipe (``-o /dev/null``) is written through:
    renaming a file onto it would replace the device itself (run as root, /dev/null became a
    regular file).
    """
    import tempfile  # here: `durapipe check` imports this module, and its cold start counts

    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if target.exists() and not target.is_file():
        with open(target, "wb") as handle:
            handle.write(payload)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(temporary, _mode_for(target))
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _mode_for(target: Path) -> int:
    """The file's own mode, or what ``open()`` would give a new file (mkstemp's is 0600)."""
    try:
        return os.stat(target).st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    # Read, not set-and-restore: os.umask would briefly change it for every thread.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


#: Folders a directory walk never enters (tools' caches, environments, VCS metadata).
_SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", ".git", ".venv", "venv", ".tox"})
#: How much of a ``.py`` file is read to tell a builder module from stage code.
_BUILDER_SNIFF_BYTES = 64 * 1024


def is_builder_module(path: Path) -> bool:
    """Whether a ``.py`` file is a pipeline (a builder module: it imports ``durapipe.dsl``),
    not a stage's program that happens to sit beside one."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_BUILDER_SNIFF_BYTES)
    except OSError:
        return False
    return b"durapipe.dsl" in head


def pipeline_sources(paths: list[str], *, builders: bool = True) -> tuple[list[str], list[str]]:
    """The inputs of ``check``, ``compile`` and ``fmt`` with each directory replaced by the
    pipelines under it, sorted: its ``.pipe`` files and (``builders``) the ``.py`` files that
    import ``durapipe.dsl``, so stage code beside them is not read as a broken pipeline.
    Returns the paths and the directories that hold none."""
    out: list[str] = []
    empty: list[str] = []
    for given in paths:
        directory = Path(given)
        if given == "-" or not directory.is_dir():
            out.append(given)
            continue
        found = []
        for root, dirs, files in os.walk(directory):
            dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS and not d.startswith("."))
            for name in sorted(files):
                path = Path(root) / name
                if name.endswith(".pipe") or (builders and name.endswith(".py")
                                              and is_builder_module(path)):
                    found.append(str(path))
        if not found:
            empty.append(given)
        out.extend(sorted(found))
    return out, empty


def expand_pipeline_inputs(paths: list[str], *, builders: bool = True) -> list[str] | None:
    """:func:`pipeline_sources` for a command line: ``None`` (after saying so on stderr)
    when a directory holds no pipeline."""
    import sys

    files, empty = pipeline_sources(paths, builders=builders)
    for directory in empty:
        print(f"durapipe: {directory} holds no pipeline (no .pipe file, and no .py that "
              "imports durapipe.dsl)", file=sys.stderr)
    return None if empty else files
