"""harness/trainer_status.py: nothing is sent outside a TrainJob, only over verified https and never
through a redirect, the token file read bounded and without blocking, one total deadline per post, and
a report that fails never fails the case. End to end: a local case posts its progress to a Trainer-like
https endpoint (Trainer's controller would inject the variables; a profile may not)."""

import http.server
import json
import os
import socket
import ssl
import subprocess
import threading
import time

import pytest

from harness import trainer_status
from harness.spec import RunSpec
from pytest_llmbench.launchers.local.launcher import LocalLauncher
from pytest_llmbench.profiles import ProfileError, load_profiles
from tests.plugin.conftest import DATA


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA and a server certificate for 127.0.0.1 (openssl)."""
    root = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=root)
    (root / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "srv.key",
             "-out", "srv.csr", cwd=root)
    _openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", "ext", "-out", "srv.crt", cwd=root)
    return root


class Endpoint:
    """An https (or plain http) server that records what is posted; ``behaviour`` shapes its answer."""

    def __init__(self, certs=None, behaviour="ok", location=""):
        self.posts, self.behaviour, self.location = [], behaviour, location
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                endpoint.posts.append({**json.loads(body),
                                       "authorization": self.headers.get("Authorization")})
                if endpoint.behaviour == "redirect":
                    self.send_response(302)
                    self.send_header("Location", endpoint.location)
                    self.end_headers()
                    return
                if endpoint.behaviour == "slow":  # the answer's first bytes, one every 3 s
                    for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}":
                        try:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                        except OSError:
                            return
                        time.sleep(3)
                    return
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if certs is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(certs / "srv.crt", certs / "srv.key")
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.scheme = "https" if certs is not None else "http"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"{self.scheme}://127.0.0.1:{self.server.server_address[1]}/status"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def trainer_env(monkeypatch, certs, tmp_path):
    (tmp_path / "token").write_text("secret-token\n")

    def point(url, token=None):
        monkeypatch.setenv(trainer_status.URL, url)
        monkeypatch.setenv(trainer_status.CA, str(certs / "ca.crt"))
        monkeypatch.setenv(trainer_status.TOKEN, str(token or tmp_path / "token"))
    return point


def test_nothing_is_sent_without_trainers_three_variables(monkeypatch):
    for name in (trainer_status.URL, trainer_status.CA, trainer_status.TOKEN):
        monkeypatch.delenv(name, raising=False)
    assert trainer_status.report(0) is False


def test_a_post_over_verified_https_carries_the_token(certs, trainer_env):
    endpoint = Endpoint(certs)
    try:
        trainer_env(endpoint.url)
        assert trainer_status.report(100, {"tokens_per_s": 12.5, "mfu": None}) is True
        (post,) = endpoint.posts
        assert post["authorization"] == "Bearer secret-token"
        assert post["trainerStatus"]["metrics"] == [{"name": "tokens_per_s", "value": "12.5"}]
    finally:
        endpoint.close()


def test_plain_http_is_refused_and_nothing_is_sent(certs, trainer_env, capsys):
    endpoint = Endpoint(None)
    try:
        trainer_env(endpoint.url)
        assert trainer_status.report(0) is False
        assert endpoint.posts == []
        assert "is not https" in capsys.readouterr().err
    finally:
        endpoint.close()


def test_a_redirect_is_not_followed_with_the_token(certs, trainer_env, capsys):
    elsewhere = Endpoint(certs)
    endpoint = Endpoint(certs, behaviour="redirect", location=elsewhere.url)
    try:
        trainer_env(endpoint.url)
        assert trainer_status.report(0) is False
        assert len(endpoint.posts) == 1 and elsewhere.posts == []
        assert "redirect to" in capsys.readouterr().err
    finally:
        endpoint.close()
        elsewhere.close()


def test_a_server_that_answers_a_byte_at_a_time_cannot_hold_the_case(certs, trainer_env, monkeypatch, capsys):
    """Without a total deadline this blocked for a minute (urllib's timeout is per read)."""
    monkeypatch.setattr(trainer_status, "TIMEOUT_S", 1.0)
    endpoint = Endpoint(certs, behaviour="slow")
    try:
        trainer_env(endpoint.url)
        started = time.monotonic()
        assert trainer_status.report(100) is False
        assert time.monotonic() - started < 30
        assert "no answer within 1 s" in capsys.readouterr().err
    finally:
        endpoint.close()


@pytest.mark.parametrize("kind", ["fifo", "device", "large", "missing"])
def test_a_token_file_that_is_not_a_small_regular_file_is_refused(certs, trainer_env, tmp_path, kind, capsys):
    endpoint = Endpoint(certs)
    token = {"fifo": tmp_path / "fifo", "device": "/dev/zero", "large": tmp_path / "large",
             "missing": tmp_path / "missing"}[kind]
    if kind == "fifo":
        os.mkfifo(token)  # nobody writes: a blocking open would hang rank 0
    if kind == "large":
        token.write_bytes(b"t" * (trainer_status.TOKEN_MAX_BYTES + 1))
    try:
        trainer_env(endpoint.url, token=token)
        assert trainer_status.report(0) is False
        assert endpoint.posts == []
        assert "TrainJob progress not reported (0%)" in capsys.readouterr().err
    finally:
        endpoint.close()


def test_a_profile_cannot_name_trainers_variables(tmp_path):
    tiny = (DATA / "tinycpu.toml").read_text()
    (tmp_path / "leaky.toml").write_text(
        tiny + '\n[env]\nKUBEFLOW_TRAINER_SERVER_URL = "http://collector.example:8080/"\n'
        if "[env]" not in tiny else tiny.replace("[env]", '[env]\nKUBEFLOW_TRAINER_SERVER_URL = "http://c:8080/"'))
    with pytest.raises(ProfileError, match=r"env\.KUBEFLOW_TRAINER_SERVER_URL.*Kubeflow Trainer's to inject"):
        load_profiles([str(tmp_path / "leaky.toml")])


def test_a_case_posts_its_start_and_its_headline_metrics(certs, tmp_path):
    """A real local case with Trainer's three variables in its ranks' environment (as Trainer's
    controller injects them): rank 0 posts 0% and then 100% with tokens/s, outside the measured steps."""
    endpoint = Endpoint(certs)
    (tmp_path / "token").write_text("secret-token\n")
    try:
        spec = RunSpec.from_preset("tiny", micro_batch=4, grad_accum=1, seq_len=32, steps=3, warmup_steps=1,
                                   threads_per_rank=1, compute_probe_steps=0, world_size=1, data_pool=8)
        env = {"DS_ACCELERATOR": "cpu", trainer_status.URL: endpoint.url,
               trainer_status.CA: str(certs / "ca.crt"), trainer_status.TOKEN: str(tmp_path / "token")}
        result = LocalLauncher().run(spec, run_dir=tmp_path / "run", run_id="progress", timeout_s=120,
                                               env=env, progress=lambda _: None)
        assert result.ok, result.describe_failure()
        assert [p["trainerStatus"]["progressPercentage"] for p in endpoint.posts] == [0, 100]
        metrics = {m["name"]: float(m["value"]) for m in endpoint.posts[1]["trainerStatus"]["metrics"]}
        assert metrics["tokens_per_s"] == pytest.approx(result.metrics["tokens_per_s"], rel=1e-5)
        assert "mfu" not in metrics  # no value on this CPU: not reported as 0
    finally:
        endpoint.close()


def test_an_endpoint_that_refuses_is_printed_and_not_raised(trainer_env, capsys):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    trainer_env(f"https://127.0.0.1:{port}/status")
    assert trainer_status.report(100, {"tokens_per_s": 1.0}) is False
    assert "TrainJob progress not reported (100%): " in capsys.readouterr().err
