"""A real S3 HTTP endpoint (moto's ThreadedMotoServer) on 127.0.0.1, for tests and benchmarks."""

from __future__ import annotations

import os
import socket
import threading
import urllib.request
import uuid

CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Serialized:
    """WSGI middleware answering one request at a time.

    moto checks If-Match / If-None-Match and then stores the object in separate Python steps,
    so two concurrent conditional PUTs can both pass the check: a lost update that real S3
    never allows (its conditional writes are atomic). Serializing requests restores that
    guarantee; moto is GIL-bound anyway, so little throughput is lost.
    """

    def __init__(self, app) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        with self.lock:
            result = self.app(environ, start_response)
            try:
                return list(result)  # the whole response is produced under the lock
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()


def _serialized_server(ip_address: str, port: int):
    from moto.server import ThreadedMotoServer

    class SerializedMotoServer(ThreadedMotoServer):
        def _server_entry(self) -> None:
            from moto.moto_server.werkzeug_app import (
                DomainDispatcherApplication,
                MotoRequestHandler,
                create_backend_app,
            )
            from werkzeug.serving import make_server

            app = _Serialized(DomainDispatcherApplication(create_backend_app))
            self._server = make_server(self._ip_address, self._port, app, True,
                                       request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    return SerializedMotoServer(ip_address=ip_address, port=port, verbose=False)


class MotoS3:
    """A running moto S3 server; ``new_bucket()`` returns an ``s3://`` URL for a fresh bucket."""

    def __init__(self) -> None:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = _serialized_server("127.0.0.1", self.port)
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
