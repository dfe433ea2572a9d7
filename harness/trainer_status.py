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
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.request
from datetime import UTC, datetime
from typing import Any

URL, CA, TOKEN = ("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_CA_CERT",
                  "KUBEFLOW_TRAINER_SERVER_TOKEN")
TIMEOUT_S = 5.0
HEADLINE = ("tokens_per_s", "step_time_median_s", "peak_memory_gib", "mfu", "loss_last")


def report(percent: int, metrics: dict[str, Any] | None = None) -> bool:
    """POST this progress (and ``metrics``' headline values) when Trainer offers an endpoint; whether
    it was accepted."""
    url, ca, token_file = (os.environ.get(k) for k in (URL, CA, TOKEN))
    if not (url and ca and token_file):
        return False
    status = {"progressPercentage": percent, "lastUpdatedTime": datetime.now(UTC).isoformat()}
    named = [{"name": k, "value": f"{metrics[k]:.6g}"} for k in HEADLINE
             if isinstance((metrics or {}).get(k), (int, float))]
    if named:
        status["metrics"] = named
    try:
        with open(token_file) as handle:  # re-read each time: the token rotates
            token = handle.read().strip()
        request = urllib.request.Request(url, data=json.dumps({"trainerStatus": status}).encode(),
                                         method="POST", headers={"Authorization": f"Bearer {token}",
                                                                 "Content-Type": "application/json"})
        context = ssl.create_default_context(cafile=ca) if url.startswith("https:") else None
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context) as answer:
            return 200 <= answer.status < 300
    except (OSError, ValueError) as exc:  # URLError, HTTPError, timeouts, a bad CA file
        print(f"llmbench harness: TrainJob progress not reported ({percent}%): {exc}", file=sys.stderr)
        return False
