"""Reading how the main container ended from the pod's status (the agent's diagnostics)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durapipe.runtime import contract
from durapipe.runtime.podstatus import container_ending, record_pod_status


def pod(terminated: dict[str, Any] | None = None, disruption: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [], "containerStatuses": []}
    state = {"terminated": terminated} if terminated else {"running": {}}
    status["containerStatuses"] = [
        {"name": "main", "state": state},
        {"name": "durapipe-agent", "state": {"running": {}}},
    ]
    if disruption:
        status["conditions"].append(
            {"type": "DisruptionTarget", "status": "True", "reason": disruption}
        )
    return {"kind": "Pod", "status": status}


@pytest.mark.parametrize(
    ("document", "verdict"),
    [
        (pod({"reason": "OOMKilled", "exitCode": 137}), contract.VERDICT_HOST_OOM),
        (
            pod({"reason": "Error", "exitCode": 86, "message": 'durapipe-verdict:gpu_oom {"a":1}'}),
            contract.VERDICT_GPU_OOM,
        ),
        (pod({"reason": "Error", "exitCode": 143}, "TerminationByKubelet"), "preempted"),
        (pod(disruption="PreemptionByScheduler"), "preempted"),
        (pod({"reason": "Error", "exitCode": 3}), None),
        (pod(), None),
    ],
)
def test_container_ending(document: dict[str, Any], verdict: str | None) -> None:
    assert container_ending(document, "main")["verdict"] == verdict


@pytest.fixture
def api_server() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    document = pod({"reason": "OOMKilled", "exitCode": 137})

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def do_GET(self) -> None:
            seen.append({"path": self.path, "auth": self.headers.get("Authorization", "")})
            body = json.dumps(document).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_record_pod_status_reads_the_api_with_the_token(
    api_server: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    api, seen = api_server
    env = {"POD_NAME": "train-abc", "POD_NAMESPACE": "ml"}
    ending = record_pod_status(tmp_path, env=env, api=api, token="s3cret")
    assert ending is not None and ending["verdict"] == contract.VERDICT_HOST_OOM
    assert seen == [{"path": "/api/v1/namespaces/ml/pods/train-abc", "auth": "Bearer s3cret"}]
    assert json.loads((tmp_path / "pod-status.json").read_text()) == ending


def test_record_pod_status_is_silent_outside_kubernetes(tmp_path: Path) -> None:
    assert record_pod_status(tmp_path, env={}) is None
    unreachable = {"POD_NAME": "p", "POD_NAMESPACE": "n"}
    assert record_pod_status(tmp_path, env=unreachable, api="http://127.0.0.1:9", token="t") is None
    assert not (tmp_path / "pod-status.json").exists()
