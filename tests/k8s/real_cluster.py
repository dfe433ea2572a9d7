"""The real control plane for the k8s launcher's tests (tools/k8s_local.py): built from source once
(``make cluster``; the tests build it too if the cache is empty and Go is there), started once per test
session and stopped by its PIDs. Where it cannot be built (no Go) the tests skip with the reason; under
CI (``CI`` set) they fail instead.

``ApiFaults`` is a fault-injecting proxy in front of the real API server: plain HTTP on loopback to the
launcher, TLS to the API server, and on request it drops the next N connections without an answer or
answers the next requests with the given status codes (429 with Retry-After, 503).
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.procs import MARK

ROOT = Path(__file__).parents[2]


def _tool(name: str):
    sys.path.insert(0, str(ROOT / "tools"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


k8s_local = _tool("k8s_local")


def start(root: Path):
    """The session's cluster, or a skip (a failure under CI) saying why there is none."""
    cache = k8s_local.cached()
    if cache is None:
        try:
            cache = k8s_local.build()
        except Exception as exc:  # noqa: BLE001 - the reason is the message
            if os.environ.get("CI"):
                pytest.fail(f"CI must run the k8s tests against the real control plane: {exc}")
            pytest.skip(f"no local control plane: {exc}")
    os.environ.pop(MARK, None)  # the control plane belongs to the session, not to the first test
    try:
        return k8s_local.LocalKube(root / "first", cache).start()
    except (RuntimeError, subprocess.SubprocessError) as exc:  # a start on a loaded host: once more
        said = getattr(exc, "stderr", "") or ""
        print(f"local control plane did not start ({exc} {said}); starting it again", file=sys.stderr)
        return k8s_local.LocalKube(root / "second", cache).start()


class ApiFaults:
    """A proxy to ``upstream`` (https) that can fail requests on purpose (module docstring)."""

    def __init__(self, upstream: str, ca: Path) -> None:
        self.upstream = upstream.removeprefix("https://")
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.lock = threading.Lock()
        self.drop = 0
        self.errors: list[tuple[int, int | None]] = []
        self.sent: list[int] = []  # what was injected, in order: 0 for a dropped connection
        self.requests: list[tuple[str, str]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy.lock:
                    proxy.requests.append((self.command, self.path))
                    if proxy.drop:
                        proxy.drop -= 1
                        proxy.sent.append(0)
                        self.close_connection = True
                        with contextlib.suppress(OSError):
                            self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    fault = proxy.errors.pop(0) if proxy.errors else None
                    if fault:
                        proxy.sent.append(fault[0])
                if fault:
                    code, retry_after = fault
                    payload = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                          "code": code, "message": "injected by the test's proxy"}).encode()
                    self.send_response(code)
                    if retry_after is not None:
                        self.send_header("Retry-After", str(retry_after))
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPSConnection(proxy.upstream, context=proxy.ctx, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status, resp.reason)
                for key, value in resp.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _forward  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, original: Path, path: Path) -> Path:
        """``original`` (the launcher's) pointed at this proxy."""
        config = json.loads(original.read_text())
        config["clusters"][0]["cluster"] = {"server": self.url}
        path.write_text(json.dumps(config))
        return path

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
