#!/usr/bin/env bash
# Build the harness image from a wheelhouse; with --push, push it and print the digest to run by.
#
#   docker/build.sh IMAGE [--push]
#   e.g. make wheelhouse WHEELHOUSE_ARGS="--no-torch"   (see below for torch)
#        docker/build.sh iad.ocir.io/mytenancy/llmbench-harness:2026-11 --push   (OCI registry for OKE)
#
# Then: pytest -m a10 --llmbench-launcher=k8s --llmbench-k8s-image=<the printed digest ref>
# Env: WHEELHOUSE (default wheelhouse/; `make wheelhouse` writes it; it must hold the torch
#        wheel the image runs: the CUDA image's comes from `tools/wheelhouse.py wheelhouse-cuda
#        --cuda`, which `make image-cuda` runs; its Python is the base's),
#      BASE (default: the Dockerfile's, the Debian base docker/debian-base.sh makes),
#      BUILDER (docker, podman or buildah; default docker where its engine answers, else buildah),
#      PLATFORM (default linux/amd64), BUILD_ARGS (extra arguments to the build),
#      SOURCE_URL (the org.opencontainers.image.source label; default: git's origin URL).
set -euo pipefail
image=${1:?usage: docker/build.sh IMAGE [--push]}
push=${2:-}
cd "$(dirname "$0")/.."
wheelhouse=${WHEELHOUSE:-wheelhouse}
if [[ ! -f $wheelhouse/requirements.txt ]]; then
    echo "docker/build.sh: no wheelhouse at $wheelhouse (WHEELHOUSE); run 'make wheelhouse' first" >&2
    exit 2
fi
if [[ -z ${BUILDER:-} ]]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then BUILDER=docker; else BUILDER=buildah; fi
fi
# Versions come from constraints.txt, the same pins the tests ran with.
pin() { sed -n "s/^$1==\([^ ]*\).*/\1/p" constraints.txt; }
args=(--platform "${PLATFORM:-linux/amd64}" -f Dockerfile
      --build-arg TORCH_VERSION="$(pin torch)" --build-arg DEEPSPEED_VERSION="$(pin deepspeed)"
      --build-arg NVML_VERSION="$(pin nvidia-ml-py)" -t "$image")
[[ -n ${BASE:-} ]] && args+=(--build-arg BASE="$BASE")
# OCI annotations (github.com/opencontainers/image-spec, annotations.md): which commit built it.
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[[ -z $(git status --porcelain --untracked-files=no 2>/dev/null) ]] || revision="$revision-dirty"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
args+=(--label "org.opencontainers.image.source=${SOURCE_URL:-$(git remote get-url origin 2>/dev/null || echo pytest-llmbench)}"
       --label "org.opencontainers.image.revision=$revision"
       --label "org.opencontainers.image.version=$version"
       --label "org.opencontainers.image.created=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
       --label "org.opencontainers.image.title=llmbench-harness")
# The build context holds exactly what the image may copy: the Dockerfile, harness/, the wheels.
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp docker/Dockerfile "$context/"
cp -r harness "$context/harness"
find "$context/harness" -name __pycache__ -prune -exec rm -rf {} +
# hard links where the wheelhouse shares a filesystem with the context (3 GB not copied), else a copy
cp -rl "$wheelhouse" "$context/wheelhouse" 2>/dev/null || { rm -rf "$context/wheelhouse"; cp -r "$wheelhouse" "$context/wheelhouse"; }
echo "building $image with $BUILDER${BASE:+ on $BASE} from $wheelhouse"
case $BUILDER in
    # chroot isolation: builds where no container runtime or user namespaces are at hand.
    buildah) buildah bud --isolation chroot "${args[@]}" ${BUILD_ARGS:-} "$context" ;;
    *) "$BUILDER" build "${args[@]}" ${BUILD_ARGS:-} "$context" ;;
esac
if [[ $push == --push ]]; then
    if [[ $BUILDER == buildah ]]; then
        buildah push --digestfile "$context/digest" "$image"
        echo "pushed; run by digest: --llmbench-k8s-image=${image%:*}@$(cat "$context/digest")"
    else
        "$BUILDER" push "$image"
        digest=$("$BUILDER" image inspect --format '{{index .RepoDigests 0}}' "$image")
        echo "pushed; run by digest: --llmbench-k8s-image=$digest"
    fi
fi
