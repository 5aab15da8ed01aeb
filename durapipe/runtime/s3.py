"""A small S3 client on the standard library: what a pod uses when its image has no obstore.

It speaks the handful of requests the checkpoint protocol needs (PUT, conditional PUT, GET,
HEAD, DELETE, ListObjectsV2), signed with AWS Signature Version 4, over ``http.client``.
Credentials come from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``), the region from ``AWS_REGION``/``AWS_DEFAULT_REGION`` and an S3-compatible
endpoint from ``AWS_ENDPOINT_URL`` (path-style addressing).  Limits, stated rather than hidden:
one request per object, so an object is at most 5 GiB; no instance-profile or web-identity
credentials (install obstore in the image for those, and for GCS or Azure).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import os
import socket
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import IO
from urllib.parse import quote, urlparse

from durapipe.runtime.hashing import new_hasher
from durapipe.runtime.storebase import (
    AlreadyExists,
    CorruptObject,
    NotFound,
    StoreError,
    TransientStoreError,
    translate_failures,
)

#: S3's limit for one PUT; larger objects need multipart uploads, which obstore does.
MAX_SINGLE_PUT = 5 * 1024**3
TIMEOUT_SECONDS = 60.0
CHUNK = 1024 * 1024
S3_XMLNS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _credentials() -> tuple[str, str, str | None]:
    key = os.environ.get("AWS_ACCESS_KEY_ID")
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        raise StoreError(
            "the stdlib S3 client needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the "
            "environment (storage_secret); for instance-profile or web-identity credentials "
            "install obstore in the image"
        )
    return key, secret, os.environ.get("AWS_SESSION_TOKEN") or None


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


class StdlibS3Store:
    """``s3://bucket/prefix`` through :mod:`http.client`; keys are relative to the prefix."""

    parallel_files = 4

    def __init__(self, uri: str) -> None:
        parsed = urlparse(uri)
        if parsed.scheme not in ("s3", "s3a") or not parsed.netloc:
            raise StoreError(f"not an S3 URI: {uri}")
        self.uri = uri.rstrip("/")
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.access_key, self.secret_key, self.token = _credentials()
        self.region = (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
                       or "us-east-1")
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            target = urlparse(endpoint)
            self.secure = target.scheme == "https"
            self.host = target.netloc
            self.base = f"{target.path.rstrip('/')}/{self.bucket}"
        elif "." in self.bucket:  # a dotted bucket breaks the wildcard certificate
            self.secure, self.host = True, f"s3.{self.region}.amazonaws.com"
            self.base = f"/{self.bucket}"
        else:
            self.secure, self.host = True, f"{self.bucket}.s3.{self.region}.amazonaws.com"
            self.base = ""

    # -- requests ----------------------------------------------------------------------------

    def _path(self, key: str) -> str:
        full = "/".join(part for part in (self.prefix, key.strip("/")) if part)
        return f"{self.base}/{quote(full, safe='/-_.~')}"

    def _headers(self, method: str, path: str, query: str, payload_hash: str,
                 extra: dict[str, str]) -> dict[str, str]:
        now = time.gmtime()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", now)
        day = stamp[:8]
        headers = {"host": self.host, "x-amz-content-sha256": payload_hash, "x-amz-date": stamp,
                   **{k.lower(): v for k, v in extra.items()}}
        if self.token:
            headers["x-amz-security-token"] = self.token
        names = sorted(headers)
        canonical = "\n".join([
            method, path, query,
            "".join(f"{name}:{headers[name].strip()}\n" for name in names),
            ";".join(names), payload_hash,
        ])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        key = _hmac(_hmac(_hmac(_hmac(f"AWS4{self.secret_key}".encode(), day), self.region),
                          "s3"), "aws4_request")
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}")
        return headers

    def _request(self, method: str, key: str | None, *, query: dict[str, str] | None = None,
                 body: bytes | IO[bytes] = b"", payload_hash: str = EMPTY_SHA256,
                 headers: dict[str, str] | None = None, sink: Callable[[bytes], object] | None = None,
                 ) -> tuple[int, dict[str, str], bytes]:
        path = self._path(key) if key is not None else f"{self.base}/" if self.base else "/"
        encoded = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                           for k, v in sorted((query or {}).items()))
        extra = dict(headers or {})
        signed = self._headers(method, path, encoded, payload_hash, extra)
        connection_type = (http.client.HTTPSConnection if self.secure
                           else http.client.HTTPConnection)
        connection = connection_type(self.host, timeout=TIMEOUT_SECONDS)
        try:
            connection.request(method, f"{path}?{encoded}" if encoded else path, body=body,
                               headers=signed)
            response = connection.getresponse()
            status = response.status
            answer = {k.lower(): v for k, v in response.getheaders()}
            if sink is not None and status == 200:
                while chunk := response.read(CHUNK):
                    sink(chunk)
                data = b""
            else:
                data = response.read()
        except (OSError, http.client.HTTPException, socket.timeout) as error:
            raise TransientStoreError(f"{method} {self.uri}/{key or ''}: "
                                      f"{type(error).__name__}: {error}") from error
        finally:
            connection.close()
        if status >= 300:
            self._raise(status, method, key, data)
        return status, answer, data

    def _raise(self, status: int, method: str, key: str | None, data: bytes) -> None:
        where = f"{method} {self.uri}/{key or ''}"
        code = ""
        try:
            code = ElementTree.fromstring(data).findtext("Code") or ""
        except ElementTree.ParseError:
            pass
        detail = f"{where}: HTTP {status} {code}".rstrip()
        if status == 404:
            raise NotFound(detail)
        if status == 412:
            raise AlreadyExists(detail)
        if status >= 500 or status in (408, 409, 429):  # 409: a concurrent conditional write
            raise TransientStoreError(detail)
        raise StoreError(detail)

    # -- the Store protocol ------------------------------------------------------------------

    @translate_failures
    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        headers = {"content-length": str(len(data))}
        if create_only:
            headers["if-none-match"] = "*"
        self._request("PUT", key, body=data, payload_hash=hashlib.sha256(data).hexdigest(),
                      headers=headers)

    @translate_failures
    def put_file(self, key: str, path: Path, *, consume: bool = False,
                 digest: str | None = None) -> str:
        size = path.stat().st_size
        if size > MAX_SINGLE_PUT:
            raise StoreError(f"{path} is {size} bytes; the stdlib S3 client uploads one "
                             "request per object (at most 5 GiB): install obstore in the image")
        sha = hashlib.sha256()
        content = new_hasher(digest.partition(":")[0]) if digest else None
        with open(path, "rb") as handle:
            while chunk := handle.read(CHUNK):
                sha.update(chunk)
                if content is not None:
                    content.update(chunk)
        if digest is not None and content is not None:
            found = f"{digest.partition(':')[0]}:{content.hexdigest()}"
            if found != digest:
                raise CorruptObject(f"{path} hashes to {found}, expected {digest}")
        # The signed SHA-256 makes S3 refuse a body damaged on the way.
        with open(path, "rb") as handle:
            _, answer, _ = self._request("PUT", key, body=handle, payload_hash=sha.hexdigest(),
                                         headers={"content-length": str(size)})
        tag = answer.get("etag", "").strip('"')
        return f"etag:{tag}" if tag else f"size:{size}"

    def _head(self, key: str) -> dict[str, str] | None:
        try:
            return self._request("HEAD", key)[1]
        except NotFound:
            return None

    @translate_failures
    def fingerprint(self, key: str, algorithm: str) -> str | None:
        meta = self._head(key)
        if meta is None:
            return None
        tag = meta.get("etag", "").strip('"')
        return f"etag:{tag}" if tag else f"size:{meta.get('content-length', '')}"

    @translate_failures
    def get_bytes(self, key: str) -> bytes:
        return self._request("GET", key)[2]

    @translate_failures
    def get_file(self, key: str, path: Path, size: int | None = None, *,
                 algorithm: str | None = None) -> str | None:
        hasher = new_hasher(algorithm) if algorithm else None

        with open(path, "wb") as handle:
            def sink(chunk: bytes) -> None:
                if hasher is not None:
                    hasher.update(chunk)
                handle.write(chunk)

            self._request("GET", key, sink=sink)
        return f"{algorithm}:{hasher.hexdigest()}" if hasher is not None else None

    @translate_failures
    def size(self, key: str) -> int | None:
        meta = self._head(key)
        return None if meta is None else int(meta.get("content-length", "0"))

    @translate_failures
    def list(self, prefix: str) -> list[str]:
        full = "/".join(part for part in (self.prefix, prefix.strip("/")) if part)
        base = f"{self.prefix}/" if self.prefix else ""
        query = {"list-type": "2", "prefix": f"{full}/" if prefix.strip("/") else base}
        keys: list[str] = []
        while True:
            data = self._request("GET", None, query=query)[2]
            root = ElementTree.fromstring(data)
            for item in root.iter(f"{S3_XMLNS}Contents"):
                name = item.findtext(f"{S3_XMLNS}Key") or ""
                keys.append(name[len(base):])
            token = root.findtext(f"{S3_XMLNS}NextContinuationToken")
            if root.findtext(f"{S3_XMLNS}IsTruncated") != "true" or not token:
                return sorted(keys)
            query["continuation-token"] = token

    @translate_failures
    def delete(self, key: str) -> None:
        try:
            self._request("DELETE", key)
        except NotFound:
            pass

    @translate_failures
    def modified(self, key: str) -> float | None:
        meta = self._head(key)
        if meta is None:
            return None
        return parsedate_to_datetime(meta["last-modified"]).timestamp()
