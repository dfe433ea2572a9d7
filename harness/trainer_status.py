"""Progress to Kubeflow Trainer's TrainJob status, when the pod is a TrainJob's and Trainer offers it.

Trainer v2.2+ with its ``TrainJobStatus`` feature gate injects ``KUBEFLOW_TRAINER_SERVER_URL``,
``KUBEFLOW_TRAINER_SERVER_CA_CERT`` (a CA file) and ``KUBEFLOW_TRAINER_SERVER_TOKEN`` (a file holding
a rotating bearer token) into the trainer's pods; a POST of ``{"trainerStatus": {...}}`` there lands
in ``TrainJob.status.trainerStatus`` (kubeflow/trainer v2.3.0, user guide "TrainJob Progress":
progressPercentage, estimatedRemainingSeconds, metrics as name/value strings, lastUpdatedTime).

Rank 0 reports twice, outside the measured steps so that no request is timed: 0% when the case
starts and 100% with its headline metrics when its result is ready. A report that fails is printed
and never fails the case (Trainer's own guidance); without the three variables nothing is sent.
Standard library only: the pod image carries the harness alone.

The variables are Trainer's to set: the launchers refuse them in a profile's ``[env]`` and an A/B
``env=`` file (pytest_llmbench/profiles/tables.py), since the token is a secret sent to that URL.
The post goes over
https only, verified against Trainer's CA file, never follows a redirect, and is bounded: the token
file is read only if it is a regular file of at most 16 KiB (opened without blocking, so a FIFO
cannot hang rank 0), and one post has one total deadline (``TIMEOUT_S``), enforced whatever the
server does (a server that answers a byte at a time cannot hold the case): a report that misses it
is abandoned, and the case's status never depends on it.
"""

from __future__ import annotations

import json
import os
import ssl
import stat
import sys
import threading
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

URL, CA, TOKEN = ("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_CA_CERT",
                  "KUBEFLOW_TRAINER_SERVER_TOKEN")
TIMEOUT_S = 5.0
TOKEN_MAX_BYTES = 16 * 1024
HEADLINE = ("tokens_per_s", "step_time_median_s", "peak_memory_gib", "mfu", "loss_last")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 - urllib's hook
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl!r} refused", headers, fp)


def read_token(path: str) -> str:
    """The bearer token: a regular file of at most TOKEN_MAX_BYTES, opened without blocking."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{TOKEN} {path!r} is not a regular file")
        if info.st_size > TOKEN_MAX_BYTES:
            raise ValueError(f"{TOKEN} {path!r} is {info.st_size} bytes (at most {TOKEN_MAX_BYTES})")
        data = os.read(fd, TOKEN_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > TOKEN_MAX_BYTES:
        raise ValueError(f"{TOKEN} {path!r} is over {TOKEN_MAX_BYTES} bytes")
    return data.decode("utf-8").strip()


def _post(url: str, ca: str, token_file: str, body: bytes) -> bool:
    token = read_token(token_file)
    context = ssl.create_default_context(cafile=ca)
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), _NoRedirect)
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with opener.open(request, timeout=TIMEOUT_S) as answer:
        return 200 <= answer.status < 300


def report(percent: int, metrics: dict[str, Any] | None = None) -> bool:
    """POST this progress (and ``metrics``' headline values) when Trainer offers an endpoint; whether
    it was accepted within the deadline."""
    url, ca, token_file = (os.environ.get(k) for k in (URL, CA, TOKEN))
    if not (url and ca and token_file):
        return False
    if not url.lower().startswith("https://"):
        print(f"llmbench harness: TrainJob progress not reported ({percent}%): {URL} is not https",
              file=sys.stderr)
        return False
    status = {"progressPercentage": percent, "lastUpdatedTime": datetime.now(UTC).isoformat()}
    named = [{"name": k, "value": f"{metrics[k]:.6g}"} for k in HEADLINE
             if isinstance((metrics or {}).get(k), (int, float))]
    if named:
        status["metrics"] = named
    body = json.dumps({"trainerStatus": status}).encode()
    outcome: list = []

    def post() -> None:
        try:
            outcome.append(_post(url, ca, token_file, body))
        except Exception as exc:  # noqa: BLE001 - URLError, HTTPError, a bad CA or token file, MemoryError
            outcome.append(exc)

    worker = threading.Thread(target=post, name="trainer-status", daemon=True)
    worker.start()
    worker.join(TIMEOUT_S)
    if not outcome:  # the deadline passed: abandoned (a daemon thread: it cannot hold the process)
        print(f"llmbench harness: TrainJob progress not reported ({percent}%): no answer within "
              f"{TIMEOUT_S:g} s", file=sys.stderr)
        return False
    if isinstance(outcome[0], BaseException):
        print(f"llmbench harness: TrainJob progress not reported ({percent}%): {outcome[0]}", file=sys.stderr)
        return False
    return bool(outcome[0])
