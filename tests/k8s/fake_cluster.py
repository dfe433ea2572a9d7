"""A fake Kubernetes API server: the subset the launcher uses, over real HTTP.

The launcher talks to it through the official ``kubernetes`` client with a kubeconfig,
exactly as to a cluster. Creating an Indexed Job starts one "pod" per completion index:
the container's command runs as a local process with the pod's environment (the
completion-index fieldRef resolved, ConfigMap and emptyDir mounts mapped to folders).
Cluster DNS and networking are emulated by pointing PET_MASTER_ADDR at 127.0.0.1 and
giving each Job its own free rendezvous port.

Faults are switched on through ``FakeCluster.faults``: pods that never schedule, image
pull errors, a tampered or truncated rank-0 log, a pod lost mid-run, API errors.

What the cluster's controllers do, it does too: a suspended Job starts no pod until it is resumed
(a JSON patch of ``/spec/suspend``); deleting an object deletes what names it in its
``ownerReferences`` (the garbage collector); a finished Job is deleted ``ttlSecondsAfterFinished``
after it ended; and with ``faults["kueue"]`` set, a Job labelled ``kueue.x-k8s.io/queue-name`` gets a
Kueue Workload (its condition as Kueue writes it) and is resumed after ``admit_after_s``, or never.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from tests.procs import MARK

REPO = Path(__file__).resolve().parents[2]
INDEX = "batch.kubernetes.io/job-completion-index"
ROUTE = re.compile(r"^/(?:api/v1|apis/(?P<group>[a-z0-9.-]+)/v1[a-z0-9]*)/namespaces/(?P<ns>[^/]+)/"
                   r"(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?(?P<log>/log)?$")
KINDS = {"configmaps": "ConfigMap", "services": "Service", "jobs": "Job",
         "networkpolicies": "NetworkPolicy", "pods": "Pod", "workloads": "Workload", "jobsets": "JobSet",
         "trainjobs": "TrainJob"}
OWNERS = ("Job", "JobSet", "TrainJob")  # what starts pods


def as_job(owner: dict, trainer_env: list[dict] = ()) -> dict:
    """What a JobSet's or a TrainJob's controllers would make of it, as the one Indexed Job whose pods this
    fake starts: a JobSet's replicated Job; for a TrainJob, the torch-distributed runtime's "node" Job with
    the trainer's container and the PET_* variables Trainer's torch plugin sets (torch.go, v2.3.0)."""
    name, kind = owner["metadata"]["name"], owner["kind"]
    if kind == "Job":
        return owner
    if kind == "JobSet":
        (replica,) = owner["spec"]["replicatedJobs"]
        spec = replica["template"]["spec"]
        labels = {**spec["template"]["metadata"].get("labels", {}), "jobset.sigs.k8s.io/jobset-name": name}
        return {"metadata": {"name": name}, "spec": {**spec, "template": {**spec["template"],
                                                                           "metadata": {"labels": labels}}}}
    trainer = owner["spec"]["trainer"]
    pet = [{"name": "PET_NNODES", "value": str(trainer["numNodes"])},
           {"name": "PET_NPROC_PER_NODE", "value": str(trainer["numProcPerNode"])},
           {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": INDEX}}},
           {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
           {"name": "PET_MASTER_PORT", "value": "29500"}]
    container = {"name": "node", "command": trainer["command"], "args": trainer["args"],
                 "env": [*trainer["env"], *pet, *trainer_env], "volumeMounts": []}
    return {"metadata": {"name": name},
            "spec": {"completions": trainer["numNodes"],
                     "activeDeadlineSeconds": owner["spec"]["activeDeadlineSeconds"],
                     "template": {"metadata": {"labels": {"jobset.sigs.k8s.io/jobset-name": name}},
                                  "spec": {"containers": [container], "volumes": []}}}}
QUEUE = "kueue.x-k8s.io/queue-name"


class Pod:
    def __init__(self, job: dict, index: int, workdir: Path) -> None:
        self.job_name = job["metadata"]["name"]
        self.index = index
        self.name = f"{self.job_name}-{index}-x{index}z"
        template = job["spec"]["template"]
        self.labels = {**template["metadata"].get("labels", {}), "job-name": self.job_name,
                       INDEX: str(index)}
        self.root = workdir / self.name
        self.log_path = self.root / "pod.log"
        self.proc: subprocess.Popen | None = None
        self.waiting: dict | None = None
        self.unschedulable = False
        self.finished_at = ""

    def start(self, job: dict, configmaps: dict, port: int) -> None:
        spec = job["spec"]["template"]["spec"]
        container = spec["containers"][0]
        mounts = self._mount(spec, container, configmaps)

        def local(text: str) -> str:  # a path under a mount, mapped to its folder (once)
            for mount_path, folder in sorted(mounts.items(), key=lambda m: -len(m[0])):
                if text == mount_path or text.startswith(mount_path + "/"):
                    return str(folder) + text[len(mount_path):]
            return text

        command = container["command"] + container["args"]
        argv = [sys.executable if a == "python" else local(a) for a in command]
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO),
               MARK: os.environ.get(MARK, "")}  # the test's mark, so tests/procs.py finds leaks
        for item in container.get("env", []):
            if "valueFrom" in item:  # the completion-index annotation fieldRef
                env[item["name"]] = str(self.index)
            else:
                env[item["name"]] = local(item["value"])
        env.update(PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port))  # cluster DNS + network
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root,
                                         start_new_session=True)
        threading.Thread(target=self._note_finish, daemon=True).start()

    def _note_finish(self) -> None:
        self.proc.wait()
        self.finished_at = datetime.now(UTC).isoformat()

    def _mount(self, spec: dict, container: dict, configmaps: dict) -> dict[str, Path]:
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {}
        for mount in container["volumeMounts"]:
            if mount["mountPath"] == "/dev/shm":
                continue
            folder = self.root / mount["name"]
            folder.mkdir(parents=True, exist_ok=True)
            source = volumes[mount["name"]]
            if "configMap" in source:
                for key, value in configmaps[source["configMap"]["name"]]["data"].items():
                    (folder / key).write_text(value)
            mounts[mount["mountPath"]] = folder
        return mounts

    def kill(self) -> None:
        """SIGKILL the container's main process (torchrun) and its process group. A container
        runtime would take every process of the pod; this fake does not, so the ranks (in
        sessions of their own) must end by themselves: the harness's parent-death signal."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    @property
    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def as_dict(self, namespace: str) -> dict:
        status: dict = {"phase": "Pending", "conditions": []}
        state: dict = {"waiting": self.waiting or {"reason": "ContainerCreating"}}
        if self.unschedulable:
            status["conditions"].append({
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."})
        elif self.proc is not None:
            rc = self.exit_code
            status["phase"] = "Running" if rc is None else ("Succeeded" if rc == 0 else "Failed")
            state = {"running": {}} if rc is None else \
                {"terminated": {"exitCode": rc, "reason": "Completed" if rc == 0 else "Error",
                                "finishedAt": self.finished_at}}
        status["containerStatuses"] = [{"name": "harness", "ready": status["phase"] == "Running",
                                        "restartCount": 0, "image": "img", "imageID": "", "state": state}]
        return {"apiVersion": "v1", "kind": "Pod", "status": status,
                "metadata": {"name": self.name, "namespace": namespace, "labels": self.labels,
                             "annotations": {INDEX: str(self.index)}}}


class FakeCluster:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.objects: dict[tuple[str, str], dict] = {}  # (kind, name) -> object
        self.pods: dict[str, Pod] = {}
        self.job_started: dict[str, float] = {}
        self.requests: list[tuple[str, str]] = []
        self.faults: dict = {}
        self.errors_sent: list[tuple[str, str, int]] = []  # the injected API errors answered
        self.created: list[dict] = []  # every object created, as stored
        self.trainer_status: dict[str, list[dict]] = {}  # TrainJob name -> the progress its pods POSTed
        self.finished: dict[str, float] = {}  # Job name -> when it was first seen finished
        self.lock = threading.RLock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.closed = threading.Event()
        threading.Thread(target=self._ttl_controller, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        return path

    def live_processes(self) -> list[Pod]:
        return [p for p in self.pods.values() if p.proc and p.proc.poll() is None]

    def close(self) -> None:
        self.closed.set()
        for pod in list(self.pods.values()):
            pod.kill()
        self.server.shutdown()

    def _ttl_controller(self) -> None:
        """Deletes a finished Job ``ttlSecondsAfterFinished`` after it ended (the TTL controller)."""
        while not self.closed.wait(0.2):
            with self.lock:
                for (kind, name), job in list(self.objects.items()):
                    if kind not in OWNERS or not _ended(self.job_status(job)):
                        continue
                    self.finished.setdefault(name, time.monotonic())
                    ttl = job["spec"].get("ttlSecondsAfterFinished")
                    if ttl is not None and time.monotonic() - self.finished[name] >= ttl:
                        self.delete(kind, name)

    # ---- API behaviour ---------------------------------------------------------------
    def create(self, kind: str, obj: dict) -> tuple[int, dict]:
        key = (kind, obj["metadata"]["name"])
        with self.lock:
            if key in self.objects:
                return 409, _status(409, "AlreadyExists", f"{kind} {key[1]} already exists")
            obj.setdefault("metadata", {})["uid"] = str(uuid.uuid4())
            self.objects[key] = obj
            self.created.append(obj)
            if kind in OWNERS and QUEUE in obj["metadata"].get("labels", {}) and "kueue" in self.faults:
                self._queue(obj)
            elif kind in OWNERS and not obj["spec"].get("suspend"):
                self._start_job(obj)
        return 201, obj

    def _queue(self, job: dict) -> None:
        """Kueue: a Workload for the Job, pending with Kueue's words until ``admit_after_s``, if any."""
        kueue, name = self.faults["kueue"], job["metadata"]["name"]
        message = kueue.get("message", "couldn't assign flavors to pod set main: insufficient unused quota "
                                       "for nvidia.com/gpu in flavor a10, 2 more needed")
        workload = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
                    "metadata": {"name": f"job-{name}-1a2b3", "uid": str(uuid.uuid4()),
                                 "labels": {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"]},
                                 "ownerReferences": [{"apiVersion": job["apiVersion"], "kind": job["kind"],
                                                      "name": name, "uid": job["metadata"]["uid"],
                                                      "controller": True}]},
                    "spec": {"queueName": job["metadata"]["labels"][QUEUE]},
                    "status": {"conditions": [{"type": "QuotaReserved", "status": "False",
                                               "reason": "Pending", "message": message}]}}
        self.objects[("Workload", workload["metadata"]["name"])] = workload
        after = kueue.get("admit_after_s")
        if after is not None:
            threading.Timer(after, self._admit, args=(job, workload)).start()

    def _admit(self, job: dict, workload: dict) -> None:
        with self.lock:
            if self.objects.get((job["kind"], job["metadata"]["name"])) is not job:
                return  # deleted meanwhile
            workload["status"]["conditions"] = [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                 "message": "Quota reserved in ClusterQueue cluster-queue"},
                {"type": "Admitted", "status": "True", "reason": "Admitted",
                 "message": "The workload is admitted"}]
            job["spec"]["suspend"] = False
            self._start_job(job)

    def patch(self, kind: str, name: str, ops: list[dict]) -> tuple[int, dict]:
        """A JSON patch; of a Job's fields only ``/spec/suspend`` (resuming starts its pods)."""
        with self.lock:
            obj = self.objects.get((kind, name))
            if obj is None:
                return 404, _status(404, "NotFound", f"{kind} {name} not found")
            for op in ops:
                if kind not in OWNERS or op.get("op") != "replace" or op.get("path") != "/spec/suspend":
                    return 422, _status(422, "Invalid", f"this fake patches only a Job's /spec/suspend: {op}")
                was, obj["spec"]["suspend"] = obj["spec"].get("suspend"), op["value"]
                if was and not op["value"]:
                    self._start_job(obj)
        return 200, obj

    def _trainer_env(self, owner: dict) -> list[dict]:
        """Trainer's TrainJobStatus gate: its progress endpoint, a CA file and a token file."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "trainer-token").write_text("fake-trainer-token\n")
        (self.workdir / "trainer-ca.crt").write_text("(unused over http)\n")
        return [{"name": "KUBEFLOW_TRAINER_SERVER_URL",
                 "value": f"{self.url}/trainer-status/{owner['metadata']['name']}"},
                {"name": "KUBEFLOW_TRAINER_SERVER_CA_CERT", "value": str(self.workdir / "trainer-ca.crt")},
                {"name": "KUBEFLOW_TRAINER_SERVER_TOKEN", "value": str(self.workdir / "trainer-token")}]

    def _start_job(self, owner: dict) -> None:
        job = as_job(owner, self._trainer_env(owner) if self.faults.get("trainer_status") else [])
        name = job["metadata"]["name"]
        self.job_started[name] = time.monotonic()
        port = _free_port()
        configmaps = {n: o for (k, n), o in self.objects.items() if k == "ConfigMap"}
        for index in range(job["spec"]["completions"]):
            pod = Pod(job, index, self.workdir)
            self.pods[pod.name] = pod
            if self.faults.get("unschedulable"):
                pod.unschedulable = True
            elif self.faults.get("image_error"):
                pod.waiting = {"reason": "ErrImagePull", "message": "manifest unknown"}
            else:
                pod.start(job, configmaps, port)
        lose = self.faults.get("lose_pod_after_s")
        if lose is not None:
            threading.Timer(lose, self._lose, args=(f"{name}-1-x1z",)).start()

    def _lose(self, pod_name: str) -> None:
        with self.lock:
            pod = self.pods.pop(pod_name, None)
        if pod:
            pod.kill()

    def job_status(self, job: dict) -> dict:
        name = job["metadata"]["name"]
        pods = [p for p in self.pods.values() if p.job_name == name]
        codes = [p.exit_code for p in pods]
        if any(c not in (None, 0) for c in codes):  # podFailurePolicy: FailJob
            for pod in pods:
                pod.kill()
            return {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
                                    "message": "Container harness exited with a non-zero code"}]}
        if name not in self.job_started:
            return {"active": 0}  # suspended since it was created
        if time.monotonic() - self.job_started[name] > as_job(job)["spec"]["activeDeadlineSeconds"]:
            for pod in pods:
                pod.kill()
            return {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}
        if pods and all(c == 0 for c in codes):  # a JobSet's condition is "Completed"
            return {"conditions": [{"type": "Completed" if job["kind"] == "JobSet" else "Complete",
                                    "status": "True"}]}
        return {"active": sum(c is None for c in codes)}

    def delete(self, kind: str, name: str) -> tuple[int, dict]:
        with self.lock:
            obj = self.objects.pop((kind, name), None)
            if obj is None:
                return 404, _status(404, "NotFound", f"{kind} {name} not found")
            if kind in OWNERS:
                for pod_name in [n for n, p in self.pods.items() if p.job_name == name]:
                    self.pods.pop(pod_name).kill()
            uid = obj["metadata"]["uid"]  # the garbage collector: what it owned goes with it
            for key, other in list(self.objects.items()):
                if any(ref.get("uid") == uid for ref in other["metadata"].get("ownerReferences", [])):
                    self.delete(*key)
        return 200, obj  # like the API server: the object as it was deleted

    def log(self, pod: Pod, tail_lines: int | None) -> str:
        text = pod.log_path.read_text(errors="replace") if pod.log_path.exists() else ""
        if pod.index == 0 and self.faults.get("tamper_log"):
            text = text.replace('"status": "ok"', '"status": "ok", "tampered": 1')
        if pod.index == 0 and self.faults.get("truncate_log"):
            text = text.split("LLMBENCH_RESULT_END")[0][:-200]
        return "\n".join(text.splitlines()[-tail_lines:]) if tail_lines else text


def _handler(cluster: FakeCluster):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep test output clean
            pass

        def _send(self, code: int, body: dict | str, headers: dict | None = None) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self):
            url = urlparse(self.path)
            cluster.requests.append((self.command, url.path))
            with cluster.lock:  # faults["drop"]: the next N requests get no answer, their connection closed
                drop = cluster.faults.get("drop", 0)
                cluster.faults["drop"] = max(0, drop - 1)
            if drop:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                cluster.errors_sent.append((self.command, url.path, 0))
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return None
            with cluster.lock:  # faults["api_errors"]: the next requests' answers, (code, Retry-After)
                errors = cluster.faults.get("api_errors") or []
                error = errors.pop(0) if errors else None
            if error:
                code, after = error
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                cluster.errors_sent.append((self.command, url.path, code))
                reason = "TooManyRequests" if code == 429 else "ServiceUnavailable"
                self._send(code, _status(code, reason, "injected"),
                           {"Retry-After": str(after)} if after is not None else None)
                return None
            match = ROUTE.match(url.path)
            if not match or match["plural"] not in KINDS:
                self._send(404, _status(404, "NotFound", url.path))
                return None
            return match, KINDS[match["plural"]], parse_qs(url.query)

        def do_POST(self) -> None:  # noqa: N802
            if self.path.startswith("/trainer-status/"):  # Trainer's progress endpoint, not the API server's
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                cluster.trainer_status.setdefault(self.path.rsplit("/", 1)[1], []).append(
                    {**body, "authorization": self.headers.get("Authorization")})
                self._send(200, body)
                return
            routed = self._route()
            if routed:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._send(*cluster.create(routed[1], body))

        def do_PATCH(self) -> None:  # noqa: N802
            routed = self._route()
            if routed:
                ops = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._send(*cluster.patch(routed[1], routed[0]["name"], ops))

        def do_DELETE(self) -> None:  # noqa: N802
            routed = self._route()
            if routed:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._send(*cluster.delete(routed[1], routed[0]["name"]))

        def do_GET(self) -> None:  # noqa: N802
            routed = self._route()
            if not routed:
                return
            match, kind, query = routed
            with cluster.lock:
                if kind == "Pod" and match["log"]:
                    pod = cluster.pods.get(match["name"])
                    tail = int(query["tailLines"][0]) if "tailLines" in query else None
                    if pod:
                        self._send(200, cluster.log(pod, tail))
                    else:
                        self._send(404, _status(404, "NotFound", match["name"]))
                elif kind == "Pod":
                    key, _, value = query.get("labelSelector", ["="])[0].partition("=")
                    items = [p.as_dict(match["ns"]) for p in cluster.pods.values()
                             if p.labels.get(key) == value]
                    self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
                elif kind == "Workload" and not match["name"]:
                    key, _, value = query.get("labelSelector", ["="])[0].partition("=")
                    items = [o for (k, _), o in cluster.objects.items()
                             if k == kind and o["metadata"]["labels"].get(key) == value]
                    self._send(200, {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "WorkloadList",
                                     "metadata": {}, "items": items})
                elif (kind, match["name"]) in cluster.objects:
                    obj = dict(cluster.objects[(kind, match["name"])])
                    if kind in OWNERS:
                        obj["status"] = cluster.job_status(obj)
                    self._send(200, obj)
                else:
                    self._send(404, _status(404, "NotFound", f"{kind} {match['name']} not found"))

    return Handler


def _ended(status: dict) -> bool:
    return any(c["type"] in ("Complete", "Completed", "Failed") and c["status"] == "True"
               for c in status.get("conditions", []))


def _status(code: int, reason: str, message: str) -> dict:
    return {"apiVersion": "v1", "kind": "Status", "status": "Success" if code < 300 else "Failure",
            "code": code, "reason": reason, "message": message}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
