"""`durapipe checkpoints list|gc`: lines found under a store root, the old ones collected,
never one a live writer holds, never a manifest left without its blobs (docs/runtime.md,
"Collecting lines")."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from durapipe.cli import main
from durapipe.runtime import linegc
from durapipe.runtime.checkpoint import Checkpoint
from durapipe.runtime.claim import LineClaim
from durapipe.runtime.restore import restore_newest
from durapipe.runtime.store import LocalStore

DAY = 86400.0


#: Days each line's objects are older than they are (a local store dates objects by their
#: ctime, which no test can set back): the store's own metadata, as S3's LastModified would be.
AGES = {"p/inputs/train/aaaa/checkpoints/": 30.0, "p/runs/wf-1/train/checkpoints/": 20.0}


class AgedStore(LocalStore):
    def modified(self, key: str) -> float | None:
        real = super().modified(key)
        for prefix, days in AGES.items():
            if real is not None and key.startswith(prefix):
                return real - days * DAY
        return real


def _line(root: Path, prefix: str, steps: int) -> Path:
    path = root / prefix
    checkpoint = Checkpoint(path.as_uri(), path=root.parent / "work" / prefix, keep=2)
    for step in range(1, steps + 1):
        checkpoint.save_sync(f"state {step}".encode() * 100, metadata={"step": step})
    checkpoint.close()
    return path


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    _line(root, "p/inputs/train/aaaa/checkpoints", 3)
    _line(root, "p/inputs/train/bbbb/checkpoints", 2)
    _line(root, "p/runs/wf-1/train/checkpoints", 1)
    # The cache's entries are no line, even with an output named like a line's part.
    cache = root / "p/cache/train/key/writer/blobs"
    cache.mkdir(parents=True)
    (cache / "x").write_text("cached")
    return root


def test_lines_are_found_and_old_ones_collected_the_rest_kept(store_root: Path) -> None:
    store = AgedStore(store_root)
    found, _ = linegc.lines(store)
    assert [(line.prefix, line.commits, line.newest_seq) for line in found] == [
        ("p/inputs/train/aaaa/checkpoints/", 2, 3), ("p/inputs/train/bbbb/checkpoints/", 2, 2),
        ("p/runs/wf-1/train/checkpoints/", 1, 1)]
    assert [round(line.age_seconds / DAY) for line in found] == [30, 0, 20]
    before = sorted(p for p in store_root.rglob("*") if p.is_file())
    dry = linegc.collect(store, max_age=14 * DAY, apply=False)
    assert [o.action.split(":")[0] for o in dry] == ["would remove", "kept", "would remove"]
    assert sorted(p for p in store_root.rglob("*") if p.is_file()) == before  # a dry run
    done = linegc.collect(store, max_age=14 * DAY, apply=True)
    assert [o.action.split(":")[0] for o in done] == ["removed", "kept", "removed"]
    left = {p.relative_to(store_root).as_posix() for p in store_root.rglob("*") if p.is_file()}
    assert not [k for k in left if k.startswith(("p/inputs/train/aaaa/", "p/runs/"))], left
    assert "p/cache/train/key/writer/blobs/x" in left
    restored = restore_newest(LocalStore(store_root / "p/inputs/train/bbbb/checkpoints"),
                              store_root.parent / "r")
    assert restored is not None and restored.commit.seq == 2


def test_a_line_a_live_writer_holds_is_never_touched(store_root: Path) -> None:
    line = store_root / "p/inputs/train/aaaa/checkpoints"
    writer = LineClaim(LocalStore(line), run_id="wf-live", lease_seconds=30)
    writer.ensure()
    try:
        outcomes = linegc.collect(AgedStore(store_root), max_age=14 * DAY, apply=True)
        (held,) = [o for o in outcomes if o.line.prefix.startswith("p/inputs/train/aaaa")]
        assert held.action.startswith("kept: a writer holds it") and "wf-live" in held.action
        assert restore_newest(LocalStore(line), store_root.parent / "r") is not None
    finally:
        writer.release()


def test_a_collector_killed_midway_leaves_restorable_commits_and_a_later_pass_finishes(
    tmp_path: Path,
) -> None:
    prefix = "p/inputs/train/aaaa/checkpoints/"
    counting = AgedStore(tmp_path / "count")
    _line(tmp_path / "count", prefix, 3)
    calls: list[str] = []
    linegc.collect(counting, max_age=14 * DAY, apply=True,
                   delete=lambda key: (calls.append(key), counting.delete(key)))
    assert [k.split("/")[-2] for k in calls][:3] == ["manifests", "manifests", "blobs"]
    for killed_after in range(len(calls)):  # before the first delete, ..., before the last
        root = tmp_path / f"k{killed_after}"
        line = _line(root, prefix, 3)
        store = AgedStore(root)
        deleted: list[str] = []

        def delete(key: str) -> None:
            if len(deleted) == killed_after:
                raise KeyboardInterrupt  # the collector dies here
            store.delete(key)
            deleted.append(key)

        with pytest.raises(KeyboardInterrupt):
            linegc.collect(store, max_age=14 * DAY, apply=True, delete=delete)
        # Whatever is left restores: no manifest lost its blobs.
        if any("/manifests/" in k for k in store.list(prefix)):
            assert restore_newest(LocalStore(line), root / "restored") is not None
        # A later pass (once the dead collector's lease ran out) removes the rest.
        time.sleep(0.05)
        linegc.collect(store, max_age=14 * DAY, apply=True, lease_seconds=0.01)
        assert not store.list(prefix), killed_after


def test_the_cli_lists_and_collects_with_a_summary(
        store_root: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linegc, "open_root", lambda uri: AgedStore(uri))
    assert main(["checkpoints", "list", str(store_root)]) == 0
    out = capsys.readouterr().out
    assert "p/inputs/train/aaaa/checkpoints/  2 commit(s), newest #3, 30.0d old" in out
    assert main(["checkpoints", "gc", str(store_root), "--max-age", "14d"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("would remove (dry run; --apply removes)\n") and "2 of 3 line(s)" in out
    assert main(["checkpoints", "gc", str(store_root), "--max-age", "14d", "--apply",
                 "--json"]) == 0
    actions = [o["action"].split(":")[0] for o in json.loads(capsys.readouterr().out)]
    assert actions == ["removed", "kept", "removed"]
    assert main(["checkpoints", "gc", str(store_root), "--max-age", "soon"]) == 2
    assert "--max-age 'soon'" in capsys.readouterr().err


def test_the_runtime_zipapp_collects_in_a_pod_with_nothing_installed(
        store_root: Path, tmp_path: Path) -> None:
    """What a CronWorkflow's pod would run: the zipapp alone, the stage image's Python."""
    import subprocess
    import sys

    from durapipe.runtime.build_zipapp import archive_bytes

    pyz = tmp_path / "durapipe-runtime.pyz"
    pyz.write_bytes(archive_bytes())
    listed = subprocess.run([sys.executable, "-S", str(pyz), "checkpoints", "list",
                             str(store_root), "--json"], capture_output=True, text=True,
                            check=False, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert listed.returncode == 0, listed.stderr
    assert [line["prefix"] for line in json.loads(listed.stdout)] == [
        "p/inputs/train/aaaa/checkpoints/", "p/inputs/train/bbbb/checkpoints/",
        "p/runs/wf-1/train/checkpoints/"]
    wrong = subprocess.run([sys.executable, "-S", str(pyz), "checkpoints", "gc",
                            str(store_root), "--max-age", "soon"], capture_output=True,
                           text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    assert wrong.returncode == 64 and "--max-age 'soon'" in wrong.stderr


# -- lines of runs that have not finished ------------------------------------------------------


def _workflow(name: str, *, completed: bool = False, resume_from: dict[str, str] | None = None,
              ) -> dict[str, object]:
    labels = {"workflows.argoproj.io/completed": "true"} if completed else {}
    params = [{"name": "lr", "value": "0.1"}]
    if resume_from is not None:
        params.append({"name": "durapipe-resume-from", "value": json.dumps(resume_from)})
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"arguments": {"parameters": params}}}


def test_a_line_a_run_still_to_finish_claimed_or_resumes_from_is_kept(store_root: Path) -> None:
    """Between two attempts a run holds no lease, only its claim: the collector keeps the
    line while the run has not finished, and the line a run resumes from by
    ``durapipe-resume-from``; a finished run protects nothing."""
    claimed = store_root / "p/inputs/train/aaaa/checkpoints"
    pending = LineClaim(LocalStore(claimed), run_id="wf-pending", lease_seconds=30)
    pending.ensure()
    pending.release()  # the attempt ended; the run's next one has not started
    resumed = (store_root / "p/runs/wf-1/train/checkpoints").as_uri()
    protection = linegc.protection_from_workflows(
        [_workflow("wf-pending"), _workflow("wf-2", resume_from={"train": resumed + "/"}),
         _workflow("wf-done", completed=True, resume_from={"train": "file:///elsewhere"})],
        "a test")
    assert protection.runs == {"wf-pending", "wf-2"}
    store = AgedStore(store_root)
    outcomes = linegc.collect(store, max_age=14 * DAY, apply=True, protection=protection)
    assert [o.action for o in outcomes] == [
        "kept: run wf-pending has not finished and has claimed it",
        "kept: its newest commit is 0s old",
        "kept: run wf-2 has not finished and resumes from it"]
    assert restore_newest(LocalStore(claimed), store_root.parent / "r") is not None
    # Once both have finished, the same pass removes both lines.
    finished = linegc.protection_from_workflows(
        [_workflow("wf-pending", completed=True), _workflow("wf-2", completed=True)], "a test")
    outcomes = linegc.collect(store, max_age=14 * DAY, apply=True, protection=finished)
    assert [o.action.split(":")[0] for o in outcomes] == ["removed", "kept", "removed"]


class _FakeApi:
    """The Kubernetes API's list of Workflows over real HTTP, two to a page, or a refusal."""

    def __init__(self, workflows: list[dict[str, object]], status: int = 200) -> None:
        import http.server
        import threading

        self.queries: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                from urllib.parse import parse_qs, urlsplit

                outer.queries.append(self.path)
                query = parse_qs(urlsplit(self.path).query)
                start = int((query.get("continue") or ["0"])[0])
                page = {"items": workflows[start:start + 2], "metadata": {}}
                if start + 2 < len(workflows):
                    page["metadata"] = {"continue": str(start + 2)}
                body = json.dumps(page if status == 200 else {"kind": "Status"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_unfinished_runs_are_read_from_the_kubernetes_api_page_by_page() -> None:
    api = _FakeApi([_workflow(f"wf-{i}") for i in range(5)])
    try:
        protection = linegc.unfinished_runs_in_cluster("ml", api=api.url, token="t")
    finally:
        api.close()
    assert protection.runs == {f"wf-{i}" for i in range(5)}
    assert len(api.queries) == 3
    assert api.queries[0].startswith("/apis/argoproj.io/v1alpha1/namespaces/ml/workflows?")
    assert "labelSelector=workflows.argoproj.io%2Fcompleted%21%3Dtrue" in api.queries[0]


def test_a_collector_that_cannot_read_the_runs_removes_nothing(
        store_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """RBAC without `list` of workflows (a 403): the pass fails before it looks at a line."""
    api = _FakeApi([], status=403)
    before = sorted(p for p in store_root.rglob("*") if p.is_file())
    try:
        code = linegc.run("gc", str(store_root), max_age="1s", apply=True, as_json=False,
                          protection=lambda: linegc.unfinished_runs_in_cluster(
                              "ml", api=api.url, token="t"))
    finally:
        api.close()
    assert code == 1
    err = capsys.readouterr().err
    assert "cannot list the Workflows of namespace ml" in err and "removes nothing" in err
    assert "`list` on `workflows`" in err
    assert sorted(p for p in store_root.rglob("*") if p.is_file()) == before
