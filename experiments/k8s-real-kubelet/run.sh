#!/usr/bin/env bash
# A real kubelet on this machine, beside the k8s tests' control plane (issue 63, item 2): kubelet
# v1.37.2 built from k8s.io/kubernetes (the pins of tools/cluster/kubernetes/go.mod), CNI plugins
# v1.10.0 from the Go proxy, Debian's containerd 1.6.20 and runc 1.1.5, a pause image built here
# (no registry), and an Indexed Job of two pods run on it. Run from the repository root, as root:
#     bash experiments/k8s-real-kubelet/run.sh [WORK]        (default WORK /tmp/llmbench-kubelet)
# Everything it starts is stopped when it ends. ~7 min cold (the kubelet's build), ~1 min after.
set -euo pipefail
repo=$(pwd)
work=${1:-/tmp/llmbench-kubelet}
here="$repo/experiments/k8s-real-kubelet"
export PATH="$PATH:/usr/local/go/bin" GOFLAGS=-trimpath CGO_ENABLED=0
mkdir -p "$work"/{ctr,cni/bin,cni/conf,kubelet-root,img}
command -v containerd >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends containerd runc
# the kubelet, from the same module pins as the control plane
if [ ! -x "$work/kubelet" ]; then
    cp tools/cluster/kubernetes/go.mod tools/cluster/kubernetes/go.sum "$work/"
    (cd "$work" && go build -mod=mod -ldflags="-s -w" -o "$work/kubelet" k8s.io/kubernetes/cmd/kubelet)
fi
for p in main/bridge main/loopback ipam/host-local meta/portmap; do
    [ -x "$work/cni/bin/$(basename $p)" ] || GOBIN="$work/cni/bin" go install "github.com/containernetworking/plugins/plugins/$p@v1.10.0"
done
# the sandbox's pause process and the pods' workload: static Go programs in images of their own
for name in pause hello; do  # pause: the node's own (tools/cluster/node/pause), hello: this experiment's
    src="$here/raw/$name.go"; [ "$name" = pause ] && src="$repo/tools/cluster/node/pause/main.go"
    mkdir -p "$work/img/$name" && cp "$src" "$work/img/$name/main.go"
    (cd "$work/img/$name" && { [ -f go.mod ] || go mod init "$name" >/dev/null 2>&1; } && go build -o "$name" .)
done
cluster="$work/cluster"
cleanup() {
    [ -f "$work/kubelet.pid" ] && kill "$(cat "$work/kubelet.pid")" 2>/dev/null || true
    pkill -f "containerd --config $work/containerd.toml" 2>/dev/null || true
    .venv/bin/python tools/k8s_local.py down "$cluster" >/dev/null 2>&1 || true
    ip link del cni-try0 2>/dev/null || true; rm -rf /var/lib/cni/networks/llmbench-try  # the CNI bridge
}
trap cleanup EXIT
.venv/bin/python tools/k8s_local.py up "$cluster" >/dev/null
sed "s|/tmp/kubelet-try|$work|g" "$here/raw/containerd.toml" > "$work/containerd.toml"
sed "s|/tmp/kubelet-try|$work|g" "$here/raw/10-bridge.conflist" > "$work/cni/conf/10-bridge.conflist"
setsid containerd --config "$work/containerd.toml" >"$work/containerd.log" 2>&1 &
sleep 3
ctr="ctr -a $work/ctr/containerd.sock -n k8s.io"
for name in pause hello; do
    c=$(buildah from scratch)
    buildah copy "$c" "$work/img/$name/$name" "/$name" >/dev/null
    buildah config --entrypoint "[\"/$name\"]" "$c"
    buildah commit -q --rm "$c" "localhost/$name:try" >/dev/null
    tag=$([ "$name" = pause ] && echo registry.k8s.io/pause:3.6 || echo localhost/hello:try)
    rm -f "$work/$name.tar"; buildah push -q "localhost/$name:try" "oci-archive:$work/$name.tar:$tag"
    $ctr images import "$work/$name.tar" >/dev/null
    buildah rmi -f "localhost/$name:try" >/dev/null
done
grep -q " kubelet-try$" /etc/hosts || echo "127.0.0.1 kubelet-try" >> /etc/hosts  # the API server dials the node by name
sed "s|/tmp/kubelet-try|$work|g" "$here/raw/kubelet-config-v1.yaml" > "$work/kubelet-config.yaml"
setsid "$work/kubelet" --config "$work/kubelet-config.yaml" --kubeconfig "$cluster/admin.kubeconfig" \
    --hostname-override kubelet-try --root-dir "$work/kubelet-root" >"$work/kubelet.log" 2>&1 &
echo $! > "$work/kubelet.pid"
kubectl="$(bash tools/cluster/build.sh --cached)/bin/kubectl --kubeconfig $cluster/admin.kubeconfig"
for _ in $(seq 60); do $kubectl get node kubelet-try >/dev/null 2>&1 && break; sleep 2; done  # registers first
$kubectl wait --for=condition=Ready node/kubelet-try --timeout=120s
$kubectl get nodes -o wide
$kubectl apply -f "$here/raw/job.yaml"
$kubectl wait --for=condition=complete job/hello-kubelet --timeout=120s
$kubectl get pods -o wide -l job-name=hello-kubelet
for p in $($kubectl get pods -l job-name=hello-kubelet -o name); do echo "== kubectl logs $p"; $kubectl logs "$p"; done
