"""A real Kubernetes control plane on this host: etcd, kube-apiserver (RBAC, Pod Security admission),
kube-controller-manager (the job, garbage-collector, ttl-after-finished, namespace and service-account
controllers), kube-scheduler, and Kueue's, JobSet's and Kubeflow Trainer's own controllers with the CRDs
and RBAC of their releases, all built from source by ``tools/cluster/build.sh`` (pins beside it).

The k8s launcher's tests run against it (tests/k8s), and so can a user who wants to try
``--llmbench-launcher=k8s`` without a cluster:

    python tools/k8s_local.py build           build the binaries once (cached outside the checkout)
    python tools/k8s_local.py up [DIR]        start it (default DIR: .llmbench/k8s); prints the
                                              KUBECONFIG lines to export (admin, and the launcher's)
    python tools/k8s_local.py down [DIR]      stop every process it started, by the PIDs it recorded

The flags follow kubernetes' ``hack/local-up-cluster.sh`` at the pinned release: certificates made with
``openssl`` (a CA, the API server's serving certificate, an admin client certificate), a service-account
signing key, etcd on loopback. Controllers run as processes of this host with a token of their own
ServiceAccount, bound by their release's RBAC; their webhooks are served on loopback ports, and the
webhook configurations and CRD conversion webhooks of their releases are pointed at those ports
(``url:`` instead of ``service:``) with this cluster's CA, as controller-runtime's envtest does.

Nodes: ``tools/k8s_node.py``'s node agents by default, the one emulated part (its docstring says what it
emulates); ``tools/k8s_kubelet.py`` adds a real one (the upstream kubelet, containerd, CNI and CoreDNS).
The control plane needs no root; both kinds of node do.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "tools" / "cluster" / "build.sh"
NAMESPACE = "llmbench"  # the namespace the project's setup.yaml makes, and the tests use
CONTROLLERS = ",".join(f"{c}-controller" for c in (
    "job", "garbage-collector", "ttl-after-finished", "namespace", "serviceaccount", "serviceaccount-token",
    "root-ca-certificate-publisher", "pod-garbage-collector", "clusterrole-aggregation", "node-lifecycle",
    "endpointslice"))  # EndpointSlices: what CoreDNS answers from on a real node (tools/k8s_kubelet.py)


def build() -> Path:
    """The cache folder with bin/ and src/ (builds them the first time; minutes, cold)."""
    if not shutil.which("go"):
        raise RuntimeError("Go is not installed (the control plane is built from source: Go 1.26)")
    out = subprocess.run(["bash", str(BUILD)], check=True, stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def cached() -> Path | None:
    """The cache folder if the pinned binaries are built, else None (builds nothing)."""
    out = subprocess.run(["bash", str(BUILD), "--cached"], stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


class Certs:
    """A CA and the certificates signed by it, as files in ``root`` (openssl)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        if not (root / "ca.crt").exists():
            _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj",
                     "/CN=llmbench-local-ca", "-keyout", "ca.key", "-out", "ca.crt", cwd=root)
        if not (root / "sa.key").exists():
            _openssl("genrsa", "-out", "sa.key", "2048", cwd=root)
            _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=root)

    def issue(self, name: str, *, cn: str, org: str | None = None, server: bool = False) -> tuple[Path, Path]:
        """``name``.crt and ``name``.key: a serving certificate for 127.0.0.1 and localhost, or a client
        certificate for user ``cn`` in group ``org``."""
        crt, key = self.root / f"{name}.crt", self.root / f"{name}.key"
        if crt.exists():
            return crt, key
        subject = f"/CN={cn}" + (f"/O={org}" if org else "")
        ext = self.root / f"{name}.ext"
        ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n" if server
                       else "extendedKeyUsage=clientAuth\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", key.name,
                 "-out", f"{name}.csr", cwd=self.root)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "3650", "-extfile", ext.name, "-out", crt.name, cwd=self.root)
        return crt, key

    @property
    def ca_b64(self) -> str:
        return base64.b64encode((self.root / "ca.crt").read_bytes()).decode()


class LocalKube:
    """The control plane in ``root`` (state, certificates, logs, kubeconfigs, PIDs); ``bin_dir`` holds the
    built binaries. ``start()`` returns once the API server is ready and every controller asked for is up;
    ``stop()`` ends every process it started (SIGTERM, then SIGKILL) and waits for each."""

    def __init__(self, root: Path, cache: Path, *,
                 controllers: tuple[str, ...] = ("kueue", "jobset", "trainer"), nodes: int = 2) -> None:
        self.root = Path(root).resolve()
        self.cache, self.bin = cache, cache / "bin"
        self.controllers, self.nodes = controllers, nodes
        self.logs = self.root / "logs"
        self.procs: dict[str, subprocess.Popen] = {}
        self.port = 0

    # ---- kubeconfigs -------------------------------------------------------------------------------
    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def launcher_kubeconfig(self) -> Path:
        """The launcher's: a token of ServiceAccount llmbench/llmbench-launcher, bound by the project's
        Role."""
        return self.root / "launcher.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _kubeconfig(self, path: Path, user: dict) -> Path:
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "local",
                  "clusters": [{"name": "local", "cluster": {
                      "server": self.server, "certificate-authority": str(self.certs.root / "ca.crt")}}],
                  "users": [{"name": "user", "user": user}],
                  "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user",
                                                             "namespace": NAMESPACE}}]}
        path.write_text(json.dumps(config, indent=1))
        path.chmod(0o600)
        return path

    def kubectl(self, *args: str, kubeconfig: Path | None = None, stdin: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess:
        config = str(kubeconfig or self.admin_kubeconfig)
        return subprocess.run([str(self.bin / "kubectl"), "--kubeconfig", config, *args], input=stdin,
                              text=True, capture_output=True, check=check, timeout=120)

    def apply(self, text: str) -> None:
        done = self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=text, check=False)
        if done.returncode:
            raise RuntimeError(f"kubectl apply failed: {done.stderr.strip()[-2000:]}")

    def token(self, namespace: str, account: str) -> str:
        return self.kubectl("create", "token", account, "-n", namespace, "--duration", "24h").stdout.strip()

    # ---- processes ---------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **(env or {})}, start_new_session=True)
        self.procs[name] = proc
        (self.root / "pids").mkdir(exist_ok=True)
        (self.root / "pids" / name).write_text(str(proc.pid))
        return proc

    def _wait(self, what: str, ready, timeout_s: float = 60.0, proc: str | None = None) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if proc and self.procs[proc].poll() is not None:
                raise RuntimeError(f"{proc} exited {self.procs[proc].returncode} while starting: "
                                   f"{self.log_tail(proc)}")
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.25)
        raise RuntimeError(f"{what} not ready after {timeout_s:g} s: {self.log_tail(proc) if proc else ''}")

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.logs / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _https_ok(self, url: str) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.certs.root / "ca.crt"))
        ctx.load_cert_chain(str(self.certs.root / "admin.crt"), str(self.certs.root / "admin.key"))
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return resp.status == 200

    # ---- the control plane -------------------------------------------------------------------------
    def start(self) -> LocalKube:
        self.root.mkdir(parents=True, exist_ok=True)
        self.certs = Certs(self.root / "pki")
        self.certs.issue("apiserver", cn="kube-apiserver", server=True)
        self.certs.issue("admin", cn="llmbench-admin", org="system:masters")
        try:
            self._start_core()
            self._bootstrap()
            from k8s_controllers import start_controllers  # tools/ is on sys.path beside this file

            start_controllers(self, self.controllers)
            if self.nodes:
                from k8s_node import start_nodes

                start_nodes(self, self.nodes)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_core(self) -> None:
        etcd_client, etcd_peer, self.port = free_ports(3)
        pki = self.certs.root
        self._spawn("etcd", [str(self.bin / "etcd"), "--name", "local", "--data-dir", str(self.root / "etcd"),
                             "--listen-client-urls", f"http://127.0.0.1:{etcd_client}",
                             "--advertise-client-urls", f"http://127.0.0.1:{etcd_client}",
                             "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
                             "--initial-cluster", f"local=http://127.0.0.1:{etcd_peer}",
                             "--unsafe-no-fsync", "--log-level", "warn"])
        self._wait("etcd", lambda: urllib.request.urlopen(f"http://127.0.0.1:{etcd_client}/health",
                                                          timeout=2).status == 200, proc="etcd")
        self._spawn("kube-apiserver", [
            str(self.bin / "kube-apiserver"), "--etcd-servers", f"http://127.0.0.1:{etcd_client}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.port),
            "--cert-dir", str(pki), "--tls-cert-file", str(pki / "apiserver.crt"),
            "--tls-private-key-file", str(pki / "apiserver.key"), "--client-ca-file", str(pki / "ca.crt"),
            "--authorization-mode", "RBAC", "--enable-admission-plugins", "PodSecurity",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-cluster-ip-range", "10.96.0.0/16", "--allow-privileged=true",
            "--endpoint-reconciler-type", "none", "--v", "1",
            # logs come from a node's kubelet: the real node's by its name, localhost (k8s_kubelet.py), the
            # emulated agents' at their InternalIP, 127.0.0.1
            "--kubelet-preferred-address-types", "Hostname,InternalIP"])
        self._kubeconfig(self.admin_kubeconfig, {"client-certificate": str(pki / "admin.crt"),
                                                 "client-key": str(pki / "admin.key")})
        self._wait("kube-apiserver", lambda: self._https_ok(f"{self.server}/readyz"), timeout_s=90,
                   proc="kube-apiserver")
        common = ["--kubeconfig", str(self.admin_kubeconfig), "--leader-elect=false", "--secure-port", "0"]
        self._spawn("kube-controller-manager", [
            str(self.bin / "kube-controller-manager"), *common, "--controllers", CONTROLLERS,
            "--use-service-account-credentials", "--service-account-private-key-file", str(pki / "sa.key"),
            "--root-ca-file", str(pki / "ca.crt"), "--v", "1"])
        self._spawn("kube-scheduler", [str(self.bin / "kube-scheduler"), *common, "--v", "1"])

    def _bootstrap(self) -> None:
        """The project's own one-time set-up (the namespace, ServiceAccount, Role, RoleBinding), as an admin
        applies it, and the launcher's kubeconfig: a token of that ServiceAccount, nothing more."""
        setup = subprocess.run([sys.executable, "-m", "pytest_llmbench.launchers.k8s.manifests", "setup",
                                "--namespace", NAMESPACE], cwd=REPO, check=True, capture_output=True,
                               text=True).stdout
        # the namespace's default ServiceAccount appears with the service-account controller
        self._wait("the serviceaccount controller", lambda: self.kubectl(
            "get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0,
            proc="kube-controller-manager")
        self.apply(setup)
        self._kubeconfig(self.launcher_kubeconfig, {"token": self.token(NAMESPACE, "llmbench-launcher")})

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        end = time.monotonic() + 10
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()
        shutil.rmtree(self.root / "pids", ignore_errors=True)


def down(root: Path) -> None:
    """Stop what ``up`` started in ``root``, by the PIDs it recorded."""
    pids = root / "pids"
    for path in sorted(pids.glob("*")) if pids.is_dir() else []:
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.killpg(int(path.read_text()), signal.SIGTERM)
    time.sleep(2)
    for path in sorted(pids.glob("*")) if pids.is_dir() else []:
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.killpg(int(path.read_text()), signal.SIGKILL)
        path.unlink()


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    root = Path(argv[1] if len(argv) > 1 else ".llmbench/k8s")
    if command == "build":
        print(build())
        return 0
    if command == "up":
        cluster = LocalKube(root, build()).start()
        for proc in cluster.procs.values():  # the processes outlive this command: `down` ends them
            proc.returncode = 0
        print(f"export KUBECONFIG={cluster.admin_kubeconfig}    # admin")
        print("# the launcher's least-privilege identity: "
              f"--llmbench-k8s-kubeconfig={cluster.launcher_kubeconfig}")
        return 0
    if command == "down":
        down(root)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main(sys.argv[1:]))
