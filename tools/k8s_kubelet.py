"""A real node for the local control plane (tools/k8s_local.py): the upstream kubelet, built from the
control plane's own module pins (``tools/cluster/build-node.sh``), Debian's containerd and runc, the CNI
bridge plugins and CoreDNS, which serves the cluster's DNS from the API server. Nothing here is emulated:
the pods are containers of the image a test imports, the rendezvous names are CoreDNS's answers, the
logs are the kubelet's.

What this VM needs of them (found and logged in experiments/k8s-real-kubelet/README.md):

- the kubelet refuses cgroup v1 unless ``failCgroupV1: false`` (KEP-5573);
- runc cannot lower a process's OOM score here: containerd's ``restrict_oom_score_adj = true``;
- no registry: images come in through ``buildah push oci-archive:`` and ``ctr images import``, the
  sandbox's pause image too (a static Go program built beside the kubelet);
- the API server reaches the kubelet at its Hostname address, ``localhost`` (the node's name), and the
  kubelet, listening on the loopback only, lets it read logs anonymously (the test API server presents no
  kubelet client certificate).

The pod network is one CNI bridge (``BRIDGE``, ``SUBNET``) whose gateway address CoreDNS listens on; the
kubelet gives that address to the pods as their nameserver. One such node runs on a host at a time (the
bridge's name is fixed; a start removes a killed run's). Needs root.

    node = RealNode(cluster, root, build_node()).start()
    node.load_image("localhost/llmbench-harness:dev")
    ...
    node.stop()      # removes the pods, then stops every process it started and undoes its mounts
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "tools" / "cluster" / "build-node.sh"
BRIDGE, SUBNET, GATEWAY = "llmbench-br0", "10.244.0.0/16", "10.244.0.1"
PAUSE_IMAGE = "localhost/llmbench-pause:built-here"
# The node's name is its hostname address, and the API server dials a kubelet at its Hostname address
# first (k8s_local: --kubelet-preferred-address-types). "localhost" resolves to the loopback, the one
# address the kubelet listens on, with nothing added to /etc/hosts. (Its InternalIP cannot be the
# loopback: the kubelet refuses a loopback --node-ip.)
NODE = "localhost"
NETNS = "/var/run/netns"  # where containerd's CRI pins a pod's network namespace (cni-<uuid>)


def build_node(*, cached_only: bool = False) -> Path | None:
    """The node's cache folder (bin/ and cni/); builds it the first time unless ``cached_only``."""
    if cached_only:
        out = subprocess.run(["bash", str(BUILD), "--cached"], stdout=subprocess.PIPE, text=True)
        return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None
    if not shutil.which("go"):
        raise RuntimeError("Go is not installed (the kubelet and CoreDNS are built from source: Go 1.26)")
    out = subprocess.run(["bash", str(BUILD)], check=True, stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def missing() -> str | None:
    """What this host lacks to run a real node, or None."""
    if os.geteuid() != 0:
        return "a real kubelet needs root (mounts, cgroups, network namespaces)"
    for tool in ("containerd", "runc", "ctr", "ip", "buildah"):
        if not shutil.which(tool):
            return f"{tool} is not installed (apt-get install containerd runc iproute2 buildah)"
    return None


class RealNode:
    """One kubelet node beside ``cluster`` (a started ``k8s_local.LocalKube``), its state in ``root``."""

    def __init__(self, cluster, root: Path, cache: Path, *, name: str = NODE) -> None:
        self.cluster, self.root, self.cache, self.name = cluster, Path(root).resolve(), cache, name
        self.sock = self.root / "containerd" / "containerd.sock"
        self.procs: dict[str, subprocess.Popen] = {}
        self.netns_before: set[str] = set()

    # ---- helpers -----------------------------------------------------------------------------------
    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(["ctr", "-a", str(self.sock), "-n", "k8s.io", *args], capture_output=True,
                              text=True, timeout=timeout, check=True)

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.root / "logs" / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _spawn(self, name: str, argv: list[str]) -> None:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        with open(self.root / "logs" / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)

    def _wait(self, what: str, ready, timeout_s: float, proc: str) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.procs[proc].poll() is not None:
                raise RuntimeError(f"{proc} exited {self.procs[proc].returncode}: {self.log_tail(proc)}")
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.5)
        raise RuntimeError(f"{what} not ready after {timeout_s:g} s: {self.log_tail(proc)}")

    # ---- start -------------------------------------------------------------------------------------
    def start(self) -> RealNode:
        if problem := missing():
            raise RuntimeError(problem)
        self.netns_before = set(os.listdir(NETNS)) if os.path.isdir(NETNS) else set()
        try:
            self._network()
            self._containerd()
            self._coredns()
            self._kubelet()
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        """The bridge, made before the first pod so that CoreDNS can listen on its gateway address (the
        CNI bridge plugin takes a bridge that exists, with its gateway already on it)."""
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)  # a killed run's
        for cmd in (["link", "add", BRIDGE, "type", "bridge"],
                    ["addr", "add", f"{GATEWAY}/16", "dev", BRIDGE], ["link", "set", BRIDGE, "up"]):
            subprocess.run(["ip", *cmd], check=True, capture_output=True)
        conf = self.root / "cni" / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "10-llmbench.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "llmbench", "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
                 "ipam": {"type": "host-local", "dataDir": str(self.root / "cni" / "ipam"),
                          "ranges": [[{"subnet": SUBNET, "gateway": GATEWAY}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}}]}))

    def _containerd(self) -> None:
        ctrd = self.root / "containerd"
        ctrd.mkdir(parents=True, exist_ok=True)
        cri = '[plugins."io.containerd.grpc.v1.cri"]'
        (ctrd / "config.toml").write_text(f"""version = 2
root = "{ctrd / 'root'}"
state = "{ctrd / 'state'}"
[grpc]
  address = "{self.sock}"
[ttrpc]
  address = "{self.sock}.ttrpc"
{cri}
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
{cri[:-1]}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{cri[:-1]}.containerd.runtimes.runc.options]
  SystemdCgroup = false
{cri[:-1]}.cni]
  bin_dir = "{self.cache / 'cni'}"
  conf_dir = "{self.root / 'cni' / 'conf'}"
""")
        self._spawn("containerd", ["containerd", "--config", str(ctrd / "config.toml")])
        self._wait("containerd", lambda: self.ctr("version", timeout=10).returncode == 0, 60, "containerd")
        # the sandbox's image: the pause process alone, in an image of its own
        self.load_binary_image(self.cache / "bin" / "pause", PAUSE_IMAGE)

    def _coredns(self) -> None:
        corefile = self.root / "Corefile"
        kubeconfig = self.cluster.admin_kubeconfig
        # cluster.local from the API server (Services, EndpointSlices); every other name is NXDOMAIN at
        # once: this host has no upstream resolver for the pods.
        corefile.write_text(f"""cluster.local:53 {{
    bind {GATEWAY}
    log
    errors
    kubernetes cluster.local {{
        kubeconfig {kubeconfig} local
    }}
}}
.:53 {{
    bind {GATEWAY}
    errors
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
""")
        self._spawn("coredns", [str(self.cache / "bin" / "coredns"), "-conf", str(corefile)])
        self._wait("coredns", lambda: "CoreDNS-" in (self.root / "logs" / "coredns.log").read_text(), 60,
                   "coredns")

    def _kubelet(self) -> None:
        from k8s_local import free_ports  # tools/ is on sys.path beside this file

        port, healthz = free_ports(2)
        kubelet_root = self.root / "kubelet"
        kubelet_root.mkdir(parents=True, exist_ok=True)
        config = self.root / "kubelet-config.json"
        config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            # on loopback only: it lets anyone who reaches it read (and exec), as the API server must
            "address": "127.0.0.1", "port": port, "healthzPort": healthz, "readOnlyPort": 0,
            "clusterDNS": [GATEWAY], "clusterDomain": "cluster.local",
            "podLogsDir": str(self.root / "pod-logs"),
            "imageGCHighThresholdPercent": 100, "evictionHard": {"memory.available": "100Mi"},
            "registerNode": True}))
        self._spawn("kubelet", [str(self.cache / "bin" / "kubelet"), "--config", str(config),
                                "--kubeconfig", str(self.cluster.admin_kubeconfig),
                                "--hostname-override", self.name,
                                "--root-dir", str(kubelet_root), "--v", "1"])

        def ready() -> bool:
            node = json.loads(self.cluster.kubectl("get", "node", self.name, "-o", "json").stdout)
            return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])

        self._wait(f"node {self.name}", ready, 180, "kubelet")

    # ---- images ------------------------------------------------------------------------------------
    def load_image(self, ref: str) -> None:
        """``ref`` from buildah's store into containerd's, as an uncompressed OCI archive (a registry's
        pull, without the registry)."""
        archive = self.root / "image.tar"
        try:
            subprocess.run(["buildah", "push", "-q", "--disable-compression", ref,
                            f"oci-archive:{archive}:{ref}"],
                           check=True, capture_output=True, text=True, timeout=1200)
            self.ctr("images", "import", str(archive), timeout=1200)
        finally:
            archive.unlink(missing_ok=True)

    def load_binary_image(self, binary: Path, ref: str) -> None:
        """An image of one static binary (its entrypoint), committed with buildah and loaded."""
        container = subprocess.run(["buildah", "from", "scratch"], check=True, capture_output=True,
                                   text=True).stdout.strip()
        try:
            subprocess.run(["buildah", "copy", container, str(binary), f"/{binary.name}"], check=True,
                           capture_output=True)
            subprocess.run(["buildah", "config", "--entrypoint", json.dumps([f"/{binary.name}"]), container],
                           check=True, capture_output=True)
            subprocess.run(["buildah", "commit", "-q", container, ref], check=True, capture_output=True)
        finally:
            subprocess.run(["buildah", "rm", container], capture_output=True)
        try:
            self.load_image(ref)
        finally:
            subprocess.run(["buildah", "rmi", "-f", ref], capture_output=True)

    # ---- stop --------------------------------------------------------------------------------------
    def pods(self) -> list[str]:
        out = self.cluster.kubectl("get", "pods", "-A", "--field-selector", f"spec.nodeName={self.name}",
                                   "-o", "json", check=False).stdout
        with contextlib.suppress(ValueError):
            return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in json.loads(out)["items"]]
        return []

    def stop(self) -> None:
        """Removes the node's pods through the kubelet (it stops their containers and tears down their
        networks), then stops the kubelet, CoreDNS, containerd and every shim, undoes the mounts under
        ``root`` and deletes the bridge."""
        kubelet = self.procs.get("kubelet")
        if kubelet is not None and kubelet.poll() is None:
            for pod in self.pods():
                ns, name = pod.split("/")
                self.cluster.kubectl("delete", "pod", name, "-n", ns, "--grace-period=0", "--wait=false",
                                     check=False)
            end = time.monotonic() + 60
            while time.monotonic() < end and (self.pods() or self.sandboxes()):
                time.sleep(1)
            self.cluster.kubectl("delete", "node", self.name, "--wait=false", check=False)
        for name in ("kubelet", "coredns"):
            self._end(name)
        if self.procs.get("containerd") is not None and self.procs["containerd"].poll() is None:
            with contextlib.suppress(subprocess.SubprocessError):  # what the kubelet left: stopped here
                for task in self.ctr("tasks", "ls", "-q", timeout=30).stdout.split():
                    subprocess.run(["ctr", "-a", str(self.sock), "-n", "k8s.io", "tasks", "kill", "-s",
                                    "SIGKILL", task], capture_output=True, timeout=30)
        self._end("containerd")
        # the shims outlive containerd by design; these ones are this node's (their -address)
        subprocess.run(["pkill", "-KILL", "-f", f"containerd-shim.* -address {self.sock}"],
                       capture_output=True)
        self._unmount()
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)
        for link in Path("/var/log/containers").glob("*.log") if Path("/var/log/containers").is_dir() else []:
            with contextlib.suppress(OSError):
                if str(self.root) in os.readlink(link):
                    link.unlink()

    def sandboxes(self) -> list[str]:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            return self.ctr("tasks", "ls", "-q", timeout=30).stdout.split()
        return []

    def _end(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def _unmount(self) -> None:
        """Every mount under ``root`` (the kubelet's volumes, containerd's rootfs and shm), deepest first,
        and the network namespaces the runtime pinned for this node's pods."""
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        mounts = [m.replace("\\040", " ") for m in mounts]
        for point in sorted((m for m in mounts if m.startswith(f"{self.root}/")), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)
        for name in set(os.listdir(NETNS)) - self.netns_before if os.path.isdir(NETNS) else ():
            if name.startswith("cni-"):  # a sandbox the kubelet did not get to remove
                subprocess.run(["umount", "-l", f"{NETNS}/{name}"], capture_output=True)
                with contextlib.suppress(OSError):
                    os.unlink(f"{NETNS}/{name}")
