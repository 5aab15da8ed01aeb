"""The fast tier builds no Go tool: a test that would, for want of its marker, fails there."""

from __future__ import annotations

import pytest

from .argo_tools import build_argo_check


def test_a_go_build_in_the_fast_tier_fails_and_names_the_marker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURAPIPE_TEST_TIER", "fast")
    with pytest.raises(pytest.fail.Exception, match="mark it `harness`"):
        build_argo_check()
