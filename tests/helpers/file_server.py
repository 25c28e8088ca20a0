"""A file server on a free loopback port, for run-batch's http(s) input and output: GET answers a stored file
(404 otherwise), PUT stores the body it is sent (read by its Content-Length: a chunked upload stores nothing and
the test sees it), calls `on_put` and answers `put_status`. Every request is recorded as (method, path)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class FileServer:
    url: str
    files: dict[str, bytes] = field(default_factory=dict)
    put_status: int = 200
    requests: list[tuple[str, str]] = field(default_factory=list)
    on_put: Callable[[], None] | None = None  # called before a PUT is answered


class _Handler(BaseHTTPRequestHandler):
    state: FileServer

    def do_GET(self) -> None:
        self.state.requests.append(("GET", self.path))
        body = self.state.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:
        self.state.requests.append(("PUT", self.path))
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.state.on_put is not None:
            self.state.on_put()
        if self.state.put_status < 300:
            self.state.files[self.path] = body
        self.send_response(self.state.put_status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:  # no access log in the test output
        pass


@contextmanager
def file_server() -> Iterator[FileServer]:
    """A running FileServer (stopped on exit)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    state = FileServer(f"http://127.0.0.1:{httpd.server_address[1]}")
    httpd.RequestHandlerClass = type("Handler", (_Handler,), {"state": state})
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
