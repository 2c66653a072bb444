"""A fake EC2 instance metadata service (IMDSv2) for the Spot tests: a session token on PUT, 401 on
a GET without it, 404 on the interruption-notice path until a test sets `notice`. Bound to loopback
by default; the Slurm tests bind it to the address the local cluster's nodes can reach."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from training.recovery import spot

TOKEN = "fake-token-123"


class FakeMetadata(ThreadingHTTPServer):
    """IMDSv2 on `host`. With `once`, the notice is served to one request, then 404 again (a node
    that replaces the reclaimed one sees none)."""

    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1", *, once: bool = False) -> None:
        super().__init__((host, 0), _Handler)
        self.notice: dict | None = None
        self.once = once
        self.requests: list[tuple[str, str, str | None]] = []
        self.served_notice = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeMetadata":
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def take_notice(self) -> dict | None:
        """The notice for this request (cleared after the first when `once`)."""
        with self._lock:
            notice = self.notice
            if notice is not None and self.once:
                self.notice = None
            return notice


class _Handler(BaseHTTPRequestHandler):
    server: FakeMetadata

    def log_message(self, *args) -> None:
        pass

    def do_PUT(self) -> None:
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self.server.requests.append(("PUT", self.path, ttl))
        self._reply(200 if self.path == spot.TOKEN_PATH and ttl else 400, TOKEN)

    def do_GET(self) -> None:
        token = self.headers.get("X-aws-ec2-metadata-token")
        self.server.requests.append(("GET", self.path, token))
        if token != TOKEN:
            return self._reply(401, "")
        notice = self.server.take_notice() if self.path == spot.NOTICE_PATH else None
        if notice is None:
            return self._reply(404, "Not Found")
        self._reply(200, json.dumps(notice))
        self.server.served_notice.set()

    def _reply(self, code: int, body: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
