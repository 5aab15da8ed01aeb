"""The real-node session: the e2e control plane on this machine's address, one real node
(tests/e2e/realnode.py) with the images built here (tests/e2e/images.py), and an S3 server
(moto's) for Argo's artifact repository and durapipe's store, reachable from pods.

Started once for this package and torn down after its last test; the teardown fails if the
machine is not as it was (a process, mount, cgroup, bridge, rule or sysctl left behind).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import Cluster, _wait, build_binaries, free_port
from e2e.realnode import RealNode, host_address, requirements_or_skip

#: The Secret a user creates for the store and the artifact repository (docs/cluster.md).
STORE_SECRET = "durapipe-store"
BUCKET = "acme-ml"
ACCESS_KEY = "durapipe-e2e"  # moto accepts any pair; these are not credentials of anything
SECRET_KEY = "durapipe-e2e-secret"
REGION = "us-east-1"


@dataclass
class S3Server:
    """moto's S3 server as its own process, on this machine's address."""

    endpoint: str
    popen: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, address: str, log: Path) -> S3Server:
        port = free_port()
        with open(log, "wb") as fh:
            popen = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", address, "-p", str(port)],
                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        server = cls(f"http://{address}:{port}", popen, log)
        _wait("moto S3 server", lambda: urllib.request.urlopen(
            server.endpoint + "/", timeout=2).status == 200, 60,
            lambda: None if popen.poll() is None else log.read_text(errors="replace"))
        return server

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)


@dataclass
class Real:
    cluster: Cluster
    node: RealNode
    s3: S3Server
    namespaces: set[str] = field(default_factory=set)

    def namespace(self, name: str) -> str:
        """A namespace with what a user sets up once: the store's Secret."""
        if name not in self.namespaces:
            self.cluster.ensure_namespace(name)
            self.cluster.apply([store_secret(name, self.s3.endpoint)])
            self.namespaces.add(name)
        return name


def store_secret(namespace: str, endpoint: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": STORE_SECRET, "namespace": namespace},
            "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                           "AWS_REGION": REGION, "AWS_ENDPOINT_URL": endpoint}}


def controller_config(s3_endpoint: str) -> dict[str, str]:
    """Argo's settings for a cluster with real pods: the executor image built here (never
    pulled), and the artifact repository on the S3 server with the namespace's store Secret."""
    from e2e.images import ARGOEXEC_IMAGE

    host = s3_endpoint.removeprefix("http://")
    return {
        "executor": yaml.safe_dump({"image": ARGOEXEC_IMAGE, "imagePullPolicy": "IfNotPresent"}),
        "artifactRepository": yaml.safe_dump({"s3": {
            "bucket": BUCKET, "endpoint": host, "insecure": True, "region": REGION,
            "keyFormat": "artifacts/{{workflow.name}}/{{pod.name}}",
            "accessKeySecret": {"name": STORE_SECRET, "key": "AWS_ACCESS_KEY_ID"},
            "secretKeySecret": {"name": STORE_SECRET, "key": "AWS_SECRET_ACCESS_KEY"}}}),
    }


@pytest.fixture(scope="package")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Real]:
    requirements_or_skip()
    if shutil.which("kubectl") is None or shutil.which("openssl") is None:
        pytest.skip("kubectl and openssl are needed for the control plane")
    from e2e import images

    bins = build_binaries()
    archives = images.build_images()
    state = tmp_path_factory.mktemp("realnode")
    address = host_address()
    (state / "logs").mkdir()
    s3 = S3Server.start(address, state / "logs" / "moto.log")
    s3.client().create_bucket(Bucket=BUCKET)
    cluster = node = None
    try:
        cluster = Cluster.start(state / "cluster", bins, address=address,
                                controller_config=controller_config(s3.endpoint))

        def load(n: RealNode) -> None:
            images.import_images(n.ctr, archives)

        node = RealNode.start(cluster, bins, state / "node", load)
        yield Real(cluster, node, s3)
    finally:
        if node is not None:
            node.stop()
        if cluster is not None:
            cluster.stop()
        s3.stop()
    left = node.leftovers() if node is not None else []
    assert not left, "the real node left things behind:\n" + "\n".join(left)
    if cluster is not None:
        assert not cluster.alive(), f"control-plane processes outlived the session: {cluster.alive()}"
