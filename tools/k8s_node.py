"""A node agent for the local control plane (tools/k8s_local.py): THE EMULATED PART. It stands in for a
kubelet and a container runtime in tests/k8s, where the pods run this checkout's harness as processes:
those tests need no image, and a case starts in a second. A real kubelet runs here too
(tools/k8s_kubelet.py), and tests/offline holds the launcher's kinds and the faults whose verdict hangs
on a kubelet's behaviour to it, with the image CI builds. Everything else in that cluster is the real
thing; this agent only does what a kubelet does for the pods the real scheduler binds to its Node:

- registers a Node (``llmbench-node-N``) with CPU, memory, pods and a declared ``nvidia.com/gpu`` count,
  Ready, its kubelet endpoint on this host;
- runs each pod bound to it as local processes, from the pod spec: the container's ``command`` and
  ``args`` (``python`` is this checkout's interpreter, standing in for the image, whose harness is this
  checkout's), its ``env`` with ``value``, the downward API (``metadata.name``, ``.namespace``,
  ``.labels[...]``, ``.annotations[...]``, ``spec.nodeName``, ``status.podIP``) and ConfigMap keys;
  ConfigMap and emptyDir volumes are folders, and a path under a ``mountPath`` in an argument or a
  variable is mapped to its folder (no mount namespace);
- gives each pod an address of its own in 127.0.0.0/8 inside one network namespace that all pods of this
  cluster share (made with ``unshare --net`` when run as root; else this host's), and makes cluster DNS
  answer as it would: ``<hostname>.<subdomain>`` and its ``.<ns>.svc.cluster.local`` form resolve to
  the pod's address while a headless Service named ``<subdomain>`` exists, through Debian's
  ``libnss-wrapper`` (``LD_PRELOAD``; ``gethostname()`` is the pod's hostname);
- reports phase, container statuses, exit codes (128 + signal for a signal), start and finish times;
- serves ``/containerLogs/<ns>/<pod>/<container>`` (``tailLines``, ``limitBytes``) over HTTPS, so
  ``kubectl logs`` and the launcher read logs through the real API server;
- ends a pod's processes when the pod is deleted (SIGTERM, its grace period, SIGKILL), records its exit
  and removes it (``gracePeriodSeconds: 0``), as a kubelet does.

Not emulated: resource limits (no cgroups: nothing is OOMKilled by a limit), images and image pulls,
probes, init containers, restarts (``restartPolicy: Never`` only), security contexts (processes run as
this user).

    python tools/k8s_node.py --kubeconfig K --name llmbench-node-1 --root DIR --port P --netns-pid PID
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

REPO = Path(__file__).resolve().parents[1]
NSS_WRAPPER = ("/usr/lib/x86_64-linux-gnu/libnss_wrapper.so", "/usr/lib/aarch64-linux-gnu/libnss_wrapper.so",
               "/usr/lib64/libnss_wrapper.so", "/usr/lib/libnss_wrapper.so")
FIELD = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
POLL_S = 0.3


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def nss_wrapper() -> str | None:
    return next((p for p in NSS_WRAPPER if os.path.exists(p)), None)


class Pod:
    """One pod's processes (one container: the launcher's pods have one) and its folders."""

    def __init__(self, obj: dict, root: Path, ip: str) -> None:
        meta = obj["metadata"]
        self.uid, self.name, self.ns = meta["uid"], meta["name"], meta["namespace"]
        self.ip = ip
        self.dir = root / "pods" / f"{self.ns}_{self.name}_{self.uid[:8]}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.container = obj["spec"]["containers"][0]["name"]
        self.log = self.dir / "container.log"
        self.proc: subprocess.Popen | None = None
        self.started_at = self.finished_at = ""
        self.exit_code: int | None = None
        self.reported: str = ""  # the last phase written to the API server

    def mounts(self, spec: dict, container: dict, configmap) -> dict[str, Path]:
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        paths = {}
        for mount in container.get("volumeMounts") or []:
            folder = self.dir / "volumes" / mount["name"]
            folder.mkdir(parents=True, exist_ok=True)
            volume = volumes.get(mount["name"], {})
            if "configMap" in volume:
                for key, value in (configmap(volume["configMap"]["name"]) or {}).items():
                    (folder / key).write_text(value)
            paths[mount["mountPath"].rstrip("/") or "/"] = folder
        return paths

    def start(self, obj: dict, node: str, configmap, netns_pid: int | None, hosts: Path) -> None:
        spec, meta = obj["spec"], obj["metadata"]
        container = spec["containers"][0]
        mounts = self.mounts(spec, container, configmap)

        def local(text: str) -> str:
            for path, folder in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
                if text == path or text.startswith(path + "/"):
                    return str(folder) + text[len(path):]
            return text

        def field(path: str) -> str:
            if path == "metadata.name":
                return meta["name"]
            if path == "metadata.namespace":
                return meta["namespace"]
            if path == "spec.nodeName":
                return node
            if path == "status.podIP":
                return self.ip
            found = FIELD.match(path)
            if found:
                return (meta.get(found.group(1)) or {}).get(found.group(2), "")
            raise ValueError(f"fieldRef {path!r} is not emulated")

        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
               "HOSTNAME": spec.get("hostname") or meta["name"]}
        for item in container.get("env") or []:
            source = item.get("valueFrom")
            if source is None:
                value = item.get("value", "")
            elif "fieldRef" in source:
                value = field(source["fieldRef"]["fieldPath"])
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                value = (configmap(ref["name"]) or {}).get(ref["key"], "")
            else:
                raise ValueError(f"env {item['name']}: {sorted(source)} is not emulated")
            env[item["name"]] = local(value)
        wrapper = nss_wrapper()
        if wrapper:  # cluster DNS and the pod's hostname
            env.update(LD_PRELOAD=wrapper, NSS_WRAPPER_HOSTS=str(hosts), NSS_WRAPPER_HOSTNAME=env["HOSTNAME"])
        argv = [local(a) for a in (container.get("command") or []) + (container.get("args") or [])]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # the image's interpreter: this checkout's (module docstring)
        if netns_pid:
            argv = ["nsenter", f"--net=/proc/{netns_pid}/ns/net", "--", *argv]
        self.started_at = now()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=mounts.get(container.get("workingDir", ""), REPO),
                                         start_new_session=True)

    def fail_to_start(self, why: str) -> None:
        self.log.write_text(f"{why}\n")
        self.started_at = self.finished_at = now()
        self.exit_code = 128

    def poll(self) -> int | None:
        if self.exit_code is None and self.proc is not None:
            code = self.proc.poll()
            if code is not None:
                self.exit_code = 128 - code if code < 0 else code
                self.finished_at = now()
        return self.exit_code

    def kill(self, grace_s: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.poll()
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=max(0.0, grace_s))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.poll()

    def status(self) -> dict:
        code = self.poll()
        state: dict
        if code is None:
            phase, state, ready = "Running", {"running": {"startedAt": self.started_at}}, "True"
        else:
            phase = "Succeeded" if code == 0 else "Failed"
            state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                    "startedAt": self.started_at, "finishedAt": self.finished_at}}
            ready = "False"
        conditions = [{"type": t, "status": s, "lastTransitionTime": now()} for t, s in
                      (("Initialized", "True"), ("Ready", ready), ("ContainersReady", ready))]
        return {"phase": phase, "podIP": self.ip, "podIPs": [{"ip": self.ip}], "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}], "startTime": self.started_at, "conditions": conditions,
                "containerStatuses": [{"name": self.container, "ready": ready == "True", "restartCount": 0,
                                       "image": "local", "imageID": "", "started": code is None,
                                       "containerID": f"local://{self.uid}", "state": state}]}


class Agent:
    def __init__(self, args) -> None:
        from kubernetes import client, config

        self.api = client.CoreV1Api(config.new_client_from_config(config_file=args.kubeconfig))
        self.name, self.root, self.port = args.name, Path(args.root), args.port
        self.netns_pid, self.gpus, self.index = args.netns_pid, args.gpus, args.index
        self.hosts = Path(args.hosts)
        self.pods: dict[str, Pod] = {}
        self.next_ip = 0

    # ---- the Node ----------------------------------------------------------------------------------
    def register(self) -> None:
        capacity = {"cpu": str(os.cpu_count() or 2), "memory": "16Gi", "pods": "32",
                    "nvidia.com/gpu": str(self.gpus), "ephemeral-storage": "50Gi"}
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "labels": {
            "kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "llmbench.dev/emulated-node": "true"}}}
        with contextlib.suppress(Exception):
            self.api.create_node(body)
        self.heartbeat(capacity)

    def heartbeat(self, capacity: dict | None = None) -> None:
        status = {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                  "message": "llmbench node agent (emulated kubelet) is ready",
                                  "lastHeartbeatTime": now(), "lastTransitionTime": now()}],
                  "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                  "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
                  "nodeInfo": {"kubeletVersion": "llmbench-node-agent", "operatingSystem": "linux",
                               "architecture": "amd64", "containerRuntimeVersion": "local://processes",
                               "kernelVersion": os.uname().release, "osImage": "emulated", "machineID": "",
                               "systemUUID": "", "bootID": "", "kubeProxyVersion": ""}}
        if capacity:
            status.update(capacity=capacity, allocatable=capacity)
        self.api.patch_node_status(self.name, {"status": status})

    # ---- pods --------------------------------------------------------------------------------------
    def configmap(self, ns: str):
        def read(name: str) -> dict | None:
            try:
                return self.api.read_namespaced_config_map(name, ns).data or {}
            except Exception:
                return None
        return read

    def _address(self) -> str:
        self.next_ip += 1
        return f"127.{100 + self.index}.{self.next_ip // 250}.{self.next_ip % 250 + 2}"

    def sync(self) -> None:
        listed = self.api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.name}",
                                                      _preload_content=False)
        items = json.loads(listed.data)["items"]
        seen = set()
        for obj in items:
            uid = obj["metadata"]["uid"]
            seen.add(uid)
            pod = self.pods.get(uid)
            if obj["metadata"].get("deletionTimestamp"):
                self._delete(obj, pod)
                continue
            if pod is None:
                if obj["status"].get("phase") in ("Succeeded", "Failed"):
                    continue  # finished before this agent (re)started
                pod = self.pods[uid] = Pod(obj, self.root, self._address())
                self._write_hosts(items)  # its name resolves before its process starts
                try:
                    pod.start(obj, self.name, self.configmap(pod.ns), self.netns_pid, self.hosts)
                except Exception as exc:  # what a kubelet reports as CreateContainerConfigError
                    pod.fail_to_start(f"llmbench node agent could not start the container: {exc}")
            self._report(obj, pod)
        for uid in set(self.pods) - seen:  # deleted behind our back (force deletion)
            self.pods.pop(uid).kill(0)
        self._write_hosts(items)

    def _report(self, obj: dict, pod: Pod) -> None:
        status = pod.status()
        if status["phase"] == pod.reported:  # each phase is written once
            return
        with contextlib.suppress(Exception):
            self.api.patch_namespaced_pod_status(pod.name, pod.ns, {"status": status})
            pod.reported = status["phase"]

    def _delete(self, obj: dict, pod: Pod | None) -> None:
        if pod is not None and pod.exit_code is None:
            pod.kill(float(obj["metadata"].get("deletionGracePeriodSeconds") or 30))
            self._report(obj, pod)
        from kubernetes.client import V1DeleteOptions

        with contextlib.suppress(Exception):
            once = V1DeleteOptions(grace_period_seconds=0, preconditions={"uid": obj["metadata"]["uid"]})
            self.api.delete_namespaced_pod(obj["metadata"]["name"], obj["metadata"]["namespace"], body=once)

    def _write_hosts(self, items: list[dict]) -> None:
        """This node's running pods' DNS records, as cluster DNS would serve them (module docstring)."""
        specs = {obj["metadata"]["uid"]: obj["spec"] for obj in items}
        headless: dict[str, set] = {}
        lines = []
        for uid, pod in list(self.pods.items()):
            if pod.exit_code is not None or uid not in specs:
                continue
            hostname, sub = specs[uid].get("hostname") or pod.name, specs[uid].get("subdomain")
            names = [hostname]
            if sub:
                if pod.ns not in headless:
                    listed = self.api.list_namespaced_service(pod.ns, _preload_content=False)
                    headless[pod.ns] = {s["metadata"]["name"] for s in json.loads(listed.data)["items"]
                                        if s["spec"].get("clusterIP") == "None"}
                if sub in headless[pod.ns]:
                    names += [f"{hostname}.{sub}", f"{hostname}.{sub}.{pod.ns}.svc.cluster.local"]
            # and its IPv4-mapped IPv6 form: glibc answers an AF_INET6 query with AI_V4MAPPED (torch's c10d
            # asks so first) by mapping the A record, which nss_wrapper does not do on its own
            lines += [f"{pod.ip} {' '.join(names)}", f"::ffff:{pod.ip} {' '.join(names)}"]
        mine = self.hosts.with_name(f"{self.hosts.name}.{self.name}")
        text = "".join(f"{line}\n" for line in lines)
        if mine.exists() and mine.read_text() == text and self.hosts.exists():
            return
        tmp = mine.with_name(f".{mine.name}.tmp")  # hidden: the glob below does not read it
        tmp.write_text(text)
        tmp.replace(mine)
        merged = "".join(p.read_text() for p in sorted(self.hosts.parent.glob(f"{self.hosts.name}.*")))
        tmp = self.hosts.with_name(f".{self.hosts.name}.{self.name}.tmp")
        tmp.write_text(merged)
        tmp.replace(self.hosts)

    def logs(self, ns: str, name: str, query: dict) -> bytes | None:
        pod = next((p for p in self.pods.values() if p.ns == ns and p.name == name), None)
        if pod is None or not pod.log.exists():
            return None
        data = pod.log.read_bytes()
        if "tailLines" in query:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(query["tailLines"][0]):]) if int(query["tailLines"][0]) else b""
        if "limitBytes" in query:
            data = data[:int(query["limitBytes"][0])]
        return data

    def serve(self, cert: str, key: str) -> None:
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                data = None
                if len(parts) == 4 and parts[0] == "containerLogs":
                    data = agent.logs(parts[1], parts[2], parse_qs(url.query))
                if data is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def run(self) -> None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        beat = 0.0
        while not stop.is_set():
            try:
                self.sync()
                if time.monotonic() - beat > 10:
                    self.heartbeat()
                    beat = time.monotonic()
            except Exception as exc:  # the API server restarting: try again
                print(f"sync: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            stop.wait(POLL_S)
        for pod in self.pods.values():  # nothing a pod started outlives its node
            pod.kill(2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--index", type=int, default=1)
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--netns-pid", type=int, default=0)
    args = parser.parse_args()
    agent = Agent(args)
    agent.serve(args.cert, args.key)
    agent.register()
    agent.run()


def netns_holder() -> subprocess.Popen | None:
    """A process that holds one new network namespace (loopback up) for every pod of a cluster, or None
    when this user cannot make one (then pods share this host's network)."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        return None
    proc = subprocess.Popen(["unshare", "--net", "--", "sh", "-c",
                             "ip link set lo up && exec sleep infinity"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # holds no pipe of its caller (`make cluster | tail`)
    time.sleep(0.3)
    return proc if proc.poll() is None else None


def start_nodes(cluster, count: int) -> None:
    """``count`` node agents for ``cluster`` (a k8s_local.LocalKube), Ready before this returns."""
    from k8s_local import free_ports

    holder = netns_holder()
    if holder is not None:
        cluster.procs["netns"] = holder
        (cluster.root / "pids").mkdir(exist_ok=True)
        (cluster.root / "pids" / "netns").write_text(str(holder.pid))
    cert, key = cluster.certs.issue("node", cn="llmbench-node", server=True)
    hosts = cluster.root / "dns" / "hosts"
    hosts.parent.mkdir(parents=True, exist_ok=True)
    hosts.write_text("")
    for index, port in enumerate(free_ports(count), start=1):
        name = f"llmbench-node-{index}"
        cluster._spawn(name, [sys.executable, str(Path(__file__).resolve()), "--kubeconfig",
                              str(cluster.admin_kubeconfig), "--name", name, "--index", str(index),
                              "--root", str(cluster.root / "nodes" / name), "--port", str(port),
                              "--cert", str(cert), "--key", str(key), "--hosts", str(hosts),
                              "--gpus", "0", "--netns-pid", str(holder.pid if holder else 0)])
    for index in range(1, count + 1):
        name = f"llmbench-node-{index}"
        cluster._wait(f"node {name}", lambda n=name: '"Ready"' in cluster.kubectl(
            "get", "node", n, "-o", "json").stdout, proc=name)


if __name__ == "__main__":
    main()
