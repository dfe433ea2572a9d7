#!/usr/bin/env bash
# Build the harness image, push it, and print the digest reference to run it by.
#
#   docker/build.sh REGISTRY/NAMESPACE/llmbench-harness[:TAG]
#   e.g. docker/build.sh iad.ocir.io/mytenancy/llmbench-harness:2026-11   (OCI registry for OKE)
#
# Then: pytest -m a10 --llmbench-launcher=k8s --llmbench-k8s-image=<the printed digest ref>
# Env: DOCKER (default docker; podman works), PLATFORM (default linux/amd64),
#      BUILD_ARGS (extra, e.g. "--build-arg CUDA_BASE=nvidia/cuda:12.6.3-base-ubuntu24.04").
set -euo pipefail
image=${1:?usage: docker/build.sh REGISTRY/NAME[:TAG]}
docker=${DOCKER:-docker}
cd "$(dirname "$0")/.."
# Versions come from constraints.txt, the same pins the tests ran with.
pin() { sed -n "s/^$1==\([^ ]*\).*/\1/p" constraints.txt; }
# shellcheck disable=SC2086
"$docker" build --platform "${PLATFORM:-linux/amd64}" -f docker/Dockerfile \
    --build-arg TORCH_VERSION="$(pin torch)" --build-arg DEEPSPEED_VERSION="$(pin deepspeed)" \
    --build-arg NVML_VERSION="$(pin nvidia-ml-py)" \
    ${BUILD_ARGS:-} -t "$image" .
"$docker" push "$image"
digest=$("$docker" image inspect --format '{{index .RepoDigests 0}}' "$image")
echo "pushed; run by digest: --llmbench-k8s-image=$digest"
