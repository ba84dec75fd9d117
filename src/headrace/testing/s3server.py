"""A real S3 HTTP endpoint (moto's ThreadedMotoServer) on 127.0.0.1, for tests and benchmarks."""

from __future__ import annotations

import os
import socket
import urllib.request
import uuid
from contextlib import contextmanager

CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoS3:
    """A running moto S3 server; ``new_bucket()`` returns an ``s3://`` URL for a fresh bucket."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    def new_bucket(self, name: str | None = None) -> str:
        name = name or f"hr-{uuid.uuid4().hex[:12]}"
        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(req, timeout=10):
            pass
        return self.url(name)

    def url(self, bucket: str, prefix: str = "") -> str:
        creds = "&".join(f"{k}={v}" for k, v in CREDENTIALS.items())
        path = f"/{prefix}" if prefix else ""
        return f"s3://{bucket}{path}?endpoint={self.endpoint}&{creds}"

    def stop(self) -> None:
        self._server.stop()


@contextmanager
def moto_s3():
    server = MotoS3()
    try:
        yield server
    finally:
        server.stop()
