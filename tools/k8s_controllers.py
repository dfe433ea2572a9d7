"""Kueue, JobSet and Kubeflow Trainer on the local control plane (tools/k8s_local.py), each from its own
release: the binary built at the pinned tag (tools/cluster/pins.env) and the manifests of that tag,
rendered with ``kubectl kustomize`` from the module's own ``config/default`` (Kueue, JobSet) or
``manifests/overlays/manager`` (Trainer). Of those manifests this installs the CRDs, the namespace, the
ServiceAccount and its RBAC, and the webhook configurations; it leaves out the Deployment, Services,
Secrets and the APIService, since the controller runs here as a process of this host with a token of
that ServiceAccount. The webhook configurations and CRD conversion webhooks get ``url:
https://127.0.0.1:PORT/...`` (the controller's webhook port) and this cluster's CA instead of
``service:``, and each controller serves a certificate this cluster's CA signed (internal certificate
management off), as controller-runtime's envtest serves webhooks.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

INSTALLED = {"CustomResourceDefinition", "Namespace", "ServiceAccount", "Role", "ClusterRole", "RoleBinding",
             "ClusterRoleBinding", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}


@dataclass(frozen=True)
class Controller:
    name: str           # its folder under the build's src/ and its binary's log name
    binary: str
    manifests: str      # the kustomization under the module that the release installs
    namespace: str
    account: str        # its ServiceAccount, as the release names it
    config_kind: str    # apiVersion of its Configuration file

    def config(self, webhook_port: int, probe_port: int, cert_dir: Path, extra_port: int) -> dict:
        common = {"apiVersion": self.config_kind, "kind": "Configuration",
                  "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
                  "metrics": {"bindAddress": "0"},
                  "leaderElection": {"leaderElect": False}}
        if self.name == "kueue":
            webhook = {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)}
            return {**common, "webhook": webhook, "internalCertManagement": {"enable": False},
                    "integrations": {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset",
                                                    "trainer.kubeflow.org/trainjob"]}}
        if self.name == "jobset":
            webhook = {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)}
            return {**common, "webhook": webhook, "internalCertManagement": {"enable": False}}
        return {**common, "webhook": {"port": webhook_port, "host": "127.0.0.1"},  # trainer: certs in $TMPDIR
                "certManagement": {"enable": False}, "statusServer": {"port": extra_port}}


KUEUE = Controller("kueue", "kueue", "config/default", "kueue-system", "kueue-controller-manager",
                   "config.kueue.x-k8s.io/v1beta2")
JOBSET = Controller("jobset", "jobset", "config/default", "jobset-system", "jobset-controller-manager",
                    "config.jobset.x-k8s.io/v1alpha1")
TRAINER = Controller("trainer", "trainer-controller-manager", "manifests/overlays/llmbench",
                     "kubeflow-system",
                     "kubeflow-trainer-controller-manager", "config.trainer.kubeflow.org/v1alpha1")
ALL = {c.name: c for c in (KUEUE, JOBSET, TRAINER)}
ORDER = ("jobset", "trainer", "kueue")  # Trainer makes JobSets; Kueue's integrations read both CRDs


def release_objects(cluster, controller: Controller) -> list[dict]:
    """What this project installs of the release's manifests (module docstring)."""
    import yaml

    source = cluster.cache / "src" / controller.name / controller.manifests
    if controller is TRAINER and not source.exists():
        without_jobset(source)
    rendered = cluster.kubectl("kustomize", str(source)).stdout
    return [obj for obj in yaml.safe_load_all(rendered) if obj and obj.get("kind") in INSTALLED]


def without_jobset(target: Path) -> None:
    """Trainer's ``manifests/overlays/manager`` as its own comment says to use it where JobSet is installed:
    without ``../../third-party/jobset`` (which fetches JobSet's manifests from GitHub). Written beside it
    as ``overlays/llmbench``, so that its relative paths hold."""
    original = target.parent / "manager" / "kustomization.yaml"
    lines = [line for line in original.read_text().splitlines() if "third-party/jobset" not in line]
    target.mkdir(exist_ok=True)
    (target / "namespace.yaml").write_text((target.parent / "manager" / "namespace.yaml").read_text())
    (target / "kustomization.yaml").write_text("\n".join(lines) + "\n")


def pointed_at(obj: dict, port: int, ca: str) -> dict:
    """A webhook configuration or CRD with its service references replaced by ``url:`` on loopback."""
    def local(client: dict) -> dict:
        service = client.pop("service", None)
        if service is not None:
            client["url"] = f"https://127.0.0.1:{port}{service.get('path', '/')}"
            client["caBundle"] = ca
        return client

    if obj["kind"].endswith("WebhookConfiguration"):
        for hook in obj.get("webhooks") or []:
            local(hook["clientConfig"])
    elif obj["kind"] == "CustomResourceDefinition":
        webhook = ((obj["spec"].get("conversion") or {}).get("webhook") or {})
        if "clientConfig" in webhook:
            local(webhook["clientConfig"])
        obj["metadata"].get("annotations", {}).pop("cert-manager.io/inject-ca-from", None)
    return obj


def start_controllers(cluster, names: tuple[str, ...]) -> None:
    """Install and start each named controller (in dependency order); returns once each is ready."""
    import yaml
    from k8s_local import free_ports

    ca = cluster.certs.ca_b64
    cert, key = cluster.certs.issue("webhooks", cn="llmbench-webhooks", server=True)
    for name in [n for n in ORDER if n in names]:
        controller = ALL[name]
        webhook_port, probe_port, extra_port = free_ports(3)
        objects = [pointed_at(obj, webhook_port, ca) for obj in release_objects(cluster, controller)]
        cluster.apply("\n---\n".join(yaml.safe_dump(o) for o in objects))
        crds = [o["metadata"]["name"] for o in objects if o["kind"] == "CustomResourceDefinition"]
        if crds:  # served before the controller asks for them (its informers fail on an unknown kind)
            cluster._wait(f"{name}'s CRDs established", lambda c=crds: set(c) <= set(served_crds(cluster)),
                          timeout_s=120)
        home = cluster.root / "controllers" / name
        certs = home / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copy(cert, certs / "tls.crt")
        shutil.copy(key, certs / "tls.key")
        # the webhook server's default folder for a controller whose config has no certDir (Trainer)
        (home / "tmp" / "k8s-webhook-server").mkdir(parents=True, exist_ok=True)
        served = home / "tmp" / "k8s-webhook-server" / "serving-certs"
        if not served.exists():
            shutil.copytree(certs, served)
        config = home / "config.yaml"
        settings = controller.config(webhook_port, probe_port, certs, extra_port)
        config.write_text(json.dumps(settings, indent=1))
        kubeconfig = cluster._kubeconfig(home / "kubeconfig",
                                         {"token": cluster.token(controller.namespace, controller.account)})
        argv = [str(cluster.bin / controller.binary), "--config", str(config),
                "--kubeconfig", str(kubeconfig), "--zap-log-level", "info"]
        if name == "kueue":  # its on-demand visibility API server reads certificates from /visibility
            # (a fixed path) and serves an APIService this cluster does not register; the launcher does not
            # use it
            argv += ["--feature-gates", "VisibilityOnDemand=false"]
            argv = kueue_metrics_certs(argv, certs)
        cluster._spawn(name, argv, env={"TMPDIR": str(home / "tmp"), "NAMESPACE": controller.namespace,
                                        "POD_NAMESPACE": controller.namespace})
        cluster._wait(f"{name}'s controller", lambda p=probe_port: _ready(p), timeout_s=120, proc=name)
        if name == "trainer":  # the runtime the launcher's TrainJobs name, from the same release
            runtimes = cluster.cache / "src" / "trainer" / "manifests" / "base" / "runtimes"
            runtime = runtimes / "torch_distributed.yaml"
            cluster.apply(runtime.read_text())


def kueue_metrics_certs(argv: list[str], certs: Path) -> list[str]:
    """Kueue 0.17 reads its metrics certificate from the fixed path /etc/kueue/metrics/certs when its
    internal certificate management is off (cmd/kueue/main.go) and exits without one. As root, it runs in a
    mount namespace of its own where this cluster's certificate is bound there (the bind mount is gone
    with the process; the empty mount point stays); else the path must exist."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return argv
    target = "/etc/kueue/metrics/certs"
    script = f'mkdir -p {target} && mount --bind "$0" {target} && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, str(certs), *argv]


def _ready(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def served_crds(cluster) -> list[str]:
    """The CRDs the API server reports Established."""
    items = json.loads(cluster.kubectl("get", "crd", "-o", "json").stdout)["items"]
    return sorted(c["metadata"]["name"] for c in items
                  if any(cond["type"] == "Established" and cond["status"] == "True"
                         for cond in c.get("status", {}).get("conditions", [])))
