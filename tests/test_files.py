"""durapipe.files.write_atomic: the one way the CLI, the compiler and the runner write files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from durapipe.files import write_atomic


def test_a_new_file_gets_the_mode_open_would_give_it(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "deep" / "new.yaml", "kind: Workflow\n")
    finally:
        os.umask(old)
    written = tmp_path / "deep" / "new.yaml"
    assert written.read_text() == "kind: Workflow\n"
    assert stat.S_IMODE(written.stat().st_mode) == 0o640  # not mkstemp's 0600


def test_an_existing_file_keeps_its_mode_and_no_temporary_is_left(tmp_path: Path) -> None:
    target = tmp_path / "p.pipe"
    target.write_text("old")
    target.chmod(0o755)
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert [p.name for p in tmp_path.iterdir()] == ["p.pipe"]


def test_a_failed_write_leaves_the_old_content_and_no_temporary(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.yaml"
    target.write_text("old")

    def crash(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.yaml"]


def test_a_device_is_written_through_not_replaced() -> None:
    write_atomic("/dev/null", "anything")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
