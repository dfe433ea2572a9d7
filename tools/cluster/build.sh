#!/usr/bin/env bash
# Builds the k8s tests' control plane from the Go module proxy into a cache
# outside the checkout, once per set of pins, and prints the cache folder:
#   bin/   etcd kube-apiserver kube-controller-manager kube-scheduler kubectl
#          kueue jobset trainer-controller-manager
#   src/   each controller's module (its CRDs, RBAC and runtimes manifests)
# Kubernetes, etcd and JobSet build in modules of their own here (go.mod files
# beside this script); Kueue and Trainer have no replace lines, so each builds
# with `go install PATH@VERSION` against its own pinned libraries.
# --cached prints the folder only if it is built (exit 1 if not).
# LLMBENCH_CLUSTER_CACHE sets the cache root (default ~/.cache/llmbench-cluster).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=pins.env
source "$here/pins.env"
key=$(cat "$here/pins.env" "$here"/*/go.mod "$here"/*/go.sum "$here"/etcd/main.go "$0" | sha256sum | cut -c1-16)
root=${LLMBENCH_CLUSTER_CACHE:-$HOME/.cache/llmbench-cluster}
out="$root/$key"
if [ -f "$out/.complete" ]; then echo "$out"; exit 0; fi
[ "${1:-}" = --cached ] && exit 1
command -v go >/dev/null || { echo "build.sh: no go on PATH (Go 1.26 is needed)" >&2; exit 1; }
rm -rf "$out.partial"
mkdir -p "$out.partial/bin" "$out.partial/src"
bin="$out.partial/bin"
export GOFLAGS=-trimpath CGO_ENABLED=0
log() { echo "[cluster build] $*" >&2; }
started=$(date +%s)

# Kubernetes: its version stamped as hack/lib/version.sh stamps a release (kubectl version reads it)
k8s=$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$here/kubernetes/go.mod")
major=${k8s#v}; minor=${major#*.}; major=${major%%.*}; minor=${minor%%.*}
stamp=""
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    stamp+=" -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    stamp+=" -X $pkg.gitTreeState=archive -X $pkg.gitCommit=module-k8s.io/kubernetes@$k8s"
done
log "kubernetes $k8s (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl)"
(cd "$here/kubernetes" && go build -mod=mod -ldflags="-s -w$stamp" -o "$bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
log "etcd"
(cd "$here/etcd" && go build -mod=mod -ldflags="-s -w" -o "$bin/etcd" .)
log "$JOBSET"
(cd "$here/jobset" && go build -mod=mod -ldflags="-s -w" -o "$bin/jobset" "${JOBSET%@*}")
for pin in "$KUEUE/cmd/kueue" "$TRAINER/cmd/trainer-controller-manager"; do
    # PATH@VERSION: PATH may be below the module (KUEUE is module@version)
    mod=${pin%%/cmd/*}; sub=${pin#"$mod"}; path="${mod%@*}$sub@${mod#*@}"
    log "$path"
    GOBIN="$bin" go install -ldflags="-s -w" "$path"
done
for mod in "$KUEUE" "$JOBSET" "$TRAINER"; do  # each release's manifests, from its own module
    dir=$(go mod download -json "$mod" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    name=$(basename "${mod%@*}"); [ "$name" = v2 ] && name=trainer
    cp -r "$dir" "$out.partial/src/$name"; chmod -R u+w "$out.partial/src/$name"
done
touch "$out.partial/.complete"
rm -rf "$out"; mv "$out.partial" "$out"
log "done in $(( $(date +%s) - started )) s: $(du -sh "$out" | cut -f1) in $out"
echo "$out"
