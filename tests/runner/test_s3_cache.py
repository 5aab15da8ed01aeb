"""`durapipe run --store s3://...` caches (issue 22): it used to turn caching off silently.

An S3 server runs in this process (moto, on 127.0.0.1); the runner reaches it through the
runtime's store clients, the stdlib one and obstore where installed."""

from __future__ import annotations

import json
import sys
import textwrap
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from durapipe.dsl import load_path
from durapipe.runner.engine import Runner, RunOptions
from durapipe.runner.records import RunRecord
from durapipe.runtime import contract
from durapipe.runtime.store import TransientStoreError, open_store
from tests.runtime.conftest import S3_CREDENTIALS, s3_endpoint  # noqa: F401 (a fixture)

PY = sys.executable
#: Each execution of `prep` appends a line to the file its first argument names, so a test
#: counts executions, not statuses.
PIPELINE = f"""
    pipeline "p" {{ storage = "s3://elsewhere/p" }}
    params {{ salt: str = "a" }}
    stage "prep" {{
      image = "x"
      command = ["{PY}", "-c", "import os, sys; open(sys.argv[1], 'a').write('ran\\\\n'); os.makedirs(sys.argv[2] + '/sub/empty'); open(sys.argv[2] + '/sub/rows.csv', 'w').write(sys.argv[3] * 1000); open(sys.argv[4], 'w').write('meta')", "COUNTER", "/out/data", params.salt, "/out/meta"]
      outputs {{ data = "/out/data"  meta = "/out/meta" }}
      cache = true
    }}
    stage "train" {{
      image = "x"
      command = ["{PY}", "-c", "import sys; open(sys.argv[2], 'w').write(open(sys.argv[1] + '/sub/rows.csv').read()[:3])", prep.outputs.data, "/out/m"]
      outputs {{ m = "/out/m" }}
    }}
"""


@pytest.fixture(params=["stdlib", "obstore"])
def s3_store(request: pytest.FixtureRequest, s3_endpoint: str,  # noqa: F811
             monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket, reached through one of the runtime's S3 clients."""
    if request.param == "obstore":
        pytest.importorskip("obstore", reason="obstore is the S3 client; it is in the test extra")
    for name, value in dict(S3_CREDENTIALS, AWS_ENDPOINT_URL=s3_endpoint).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(contract.ENV_STORE_CLIENT, request.param)
    bucket = f"cache-{uuid.uuid4().hex[:12]}"
    urllib.request.urlopen(urllib.request.Request(f"{s3_endpoint}/{bucket}", method="PUT"),
                           timeout=30).read()
    return f"s3://{bucket}/team/durapipe"


def _run(tmp_path: Path, store: str, **options: Any) -> RunRecord:
    path = tmp_path / "p.pipe"
    path.write_text(textwrap.dedent(PIPELINE).replace("COUNTER", str(tmp_path / "count")))
    result = load_path(path)
    assert result.pipeline is not None, result.diagnostics
    opts = RunOptions(home=tmp_path / ".durapipe", store=store, backoff_scale=0.0, **options)
    return Runner(result.pipeline, str(path), opts).run()


def _executions(tmp_path: Path) -> int:
    counter = tmp_path / "count"
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def _entries(store: str) -> list[str]:
    return [k for k in open_store(store).list("p/cache/prep") if k.endswith("/entry.json")]


def test_a_second_run_hits_the_s3_cache(tmp_path: Path, s3_store: str) -> None:
    first = _run(tmp_path, s3_store)
    assert first.status == "succeeded", first.stages["prep"].reason
    assert first.stages["prep"].status == "succeeded"
    assert _executions(tmp_path) == 1
    assert len(_entries(s3_store)) == 1

    again = _run(tmp_path, s3_store)
    assert again.status == "succeeded", again.stages["train"].reason
    assert again.stages["prep"].status == "cached"
    assert again.stages["prep"].cache_key == first.stages["prep"].cache_key
    assert _executions(tmp_path) == 1  # not executed again
    # The outputs came back whole, into this run's directory: files, nesting, empty dirs.
    data = Path(again.stages["prep"].outputs["data"])
    assert again.run_id in str(data)
    assert (data / "sub" / "rows.csv").read_text() == "a" * 1000
    assert (data / "sub" / "empty").is_dir()
    assert Path(again.stages["prep"].outputs["meta"]).read_text() == "meta"
    assert again.stages["prep"].output_hashes == first.stages["prep"].output_hashes
    assert Path(again.stages["train"].outputs["m"]).read_text() == "aaa"

    changed = _run(tmp_path, s3_store, params={"salt": "b"})
    assert changed.stages["prep"].status == "succeeded"
    assert changed.stages["prep"].cache_miss == "param salt: 'a' -> 'b'"
    assert _executions(tmp_path) == 2


def test_an_interrupted_cache_write_leaves_no_entry(
        tmp_path: Path, s3_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer dies after uploading one file: no entry names it, the next run executes the
    stage (and commits a whole entry), and the one after hits."""
    store_type = type(open_store(s3_store))
    real_put_file = store_type.put_file
    uploads: list[str] = []

    def put_file_then_fail(self: Any, key: str, path: Path, **kw: Any) -> str:
        uploads.append(key)
        if len(uploads) == 2:
            raise TransientStoreError("connection reset (injected)")
        return real_put_file(self, key, path, **kw)

    monkeypatch.setattr(store_type, "put_file", put_file_then_fail)
    broken = _run(tmp_path, s3_store)
    assert broken.stages["prep"].status == "succeeded"  # the stage did succeed
    assert len(uploads) == 2
    assert _entries(s3_store) == []
    assert any(k.startswith("p/cache/prep/") for k in open_store(s3_store).list("p/cache"))
    monkeypatch.setattr(store_type, "put_file", real_put_file)

    rerun = _run(tmp_path, s3_store)
    assert rerun.stages["prep"].status == "succeeded"
    assert _executions(tmp_path) == 2
    assert len(_entries(s3_store)) == 1
    assert _run(tmp_path, s3_store).stages["prep"].status == "cached"
    assert _executions(tmp_path) == 2


def test_a_damaged_entry_is_a_miss_not_half_an_output(tmp_path: Path, s3_store: str) -> None:
    """A file the entry names is gone, or differs from its digest: the stage runs again and
    no partial output is left in the run directory."""
    _run(tmp_path, s3_store)
    store = open_store(s3_store)
    (entry_key,) = _entries(s3_store)
    entry = json.loads(store.get_bytes(entry_key))
    prefix = entry_key.rsplit("/", 1)[0] + "/" + entry["writer"]
    store.put_bytes(f"{prefix}/data/sub/rows.csv", b"tampered")
    tampered = _run(tmp_path, s3_store)
    assert tampered.stages["prep"].status == "succeeded"
    assert _executions(tmp_path) == 2
    assert Path(tampered.stages["prep"].outputs["data"], "sub", "rows.csv").read_text() == \
        "a" * 1000

    (entry_key,) = _entries(s3_store)
    entry = json.loads(store.get_bytes(entry_key))
    store.delete(entry_key.rsplit("/", 1)[0] + "/" + entry["writer"] + "/meta")
    gone = _run(tmp_path, s3_store)
    assert gone.stages["prep"].status == "succeeded"
    assert _executions(tmp_path) == 3
    leftovers = [p.name for p in (tmp_path / ".durapipe" / "runs" / gone.run_id / "prep").iterdir()
                 if p.name.startswith(".cache-restore")]
    assert leftovers == []
