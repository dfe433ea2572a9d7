#!/usr/bin/env bash
# Builds a real node for the k8s tests' control plane (tools/k8s_kubelet.py) into a cache outside the
# checkout, once per set of pins, and prints the cache folder:
#   bin/       kubelet (k8s.io/kubernetes at the control plane's pin, tools/cluster/kubernetes/go.mod),
#              coredns (cluster DNS), pause (the pod sandbox's process, node/pause)
#   cni/       the CNI plugins bridge, host-local, loopback and portmap
# The container runtime is Debian's containerd and runc (apt), not built here.
# --cached prints the folder only if it is built (exit 1 if not).
# LLMBENCH_CLUSTER_CACHE sets the cache root (default ~/.cache/llmbench-cluster).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CNI=github.com/containernetworking/plugins@v1.10.0
COREDNS=github.com/coredns/coredns@v1.15.0
key=$(cat "$here/kubernetes/go.mod" "$here/kubernetes/go.sum" "$here"/node/pause/* "$0" | sha256sum | cut -c1-16)
root=${LLMBENCH_CLUSTER_CACHE:-$HOME/.cache/llmbench-cluster}
out="$root/node-$key"
if [ -f "$out/.complete" ]; then echo "$out"; exit 0; fi
[ "${1:-}" = --cached ] && exit 1
command -v go >/dev/null || { echo "build-node.sh: no go on PATH (Go 1.26 is needed)" >&2; exit 1; }
rm -rf "$out.partial"
mkdir -p "$out.partial/bin" "$out.partial/cni" "$out.partial/mod"
export GOFLAGS=-trimpath CGO_ENABLED=0
log() { echo "[node build] $*" >&2; }
started=$(date +%s)
# the kubelet from the control plane's own module pins (a copy: -mod=mod may add go.sum lines)
k8s=$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$here/kubernetes/go.mod")
major=${k8s#v}; minor=${major#*.}; major=${major%%.*}; minor=${minor%%.*}
stamp=""
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    stamp+=" -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    stamp+=" -X $pkg.gitTreeState=archive -X $pkg.gitCommit=module-k8s.io/kubernetes@$k8s"
done
log "kubelet $k8s"
cp "$here/kubernetes/go.mod" "$here/kubernetes/go.sum" "$out.partial/mod/"
(cd "$out.partial/mod" && go build -mod=mod -ldflags="-s -w$stamp" -o "$out.partial/bin/kubelet" \
    k8s.io/kubernetes/cmd/kubelet)
log "$COREDNS"
GOBIN="$out.partial/bin" go install -ldflags="-s -w" "$COREDNS"
log "$CNI"
for p in main/bridge main/loopback ipam/host-local meta/portmap; do
    GOBIN="$out.partial/cni" go install -ldflags="-s -w" "${CNI%@*}/plugins/$p@${CNI#*@}"
done
log "pause"
(cd "$here/node/pause" && go build -ldflags="-s -w" -o "$out.partial/bin/pause" .)
rm -rf "$out.partial/mod"
touch "$out.partial/.complete"
rm -rf "$out"; mv "$out.partial" "$out"
log "done in $(( $(date +%s) - started )) s: $(du -sh "$out" | cut -f1) in $out"
echo "$out"
