#!/usr/bin/env bash
# A Debian base image with python3 and venv, made locally with debootstrap: it stands in for
# a registry base where none can be pulled (no registry access, or an air-gapped build host
# with a Debian mirror). Its Python (3.11 for bookworm) is what the wheelhouse must target.
#
#   docker/debian-base.sh [NAME]        default localhost/llmbench-base:bookworm
# Env: SUITE (default bookworm), MIRROR (default http://deb.debian.org/debian),
#      BUILDER (docker or buildah; default docker where its engine answers, else buildah).
# Needs root, debootstrap, and buildah or docker.
set -euo pipefail
name=${1:-localhost/llmbench-base:${SUITE:-bookworm}}
if [[ -z ${BUILDER:-} ]]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then BUILDER=docker; else BUILDER=buildah; fi
fi
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv "${SUITE:-bookworm}" "$rootfs" \
    "${MIRROR:-http://deb.debian.org/debian}" >/dev/null
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
if [[ $BUILDER == buildah ]]; then
    container=$(buildah from scratch)
    cp -a "$rootfs"/. "$(buildah mount "$container")"/
    buildah umount "$container" >/dev/null
    buildah config --cmd /bin/bash "$container"
    buildah commit -q "$container" "$name" >/dev/null
    buildah rm "$container" >/dev/null
else
    tar -C "$rootfs" -c . | "$BUILDER" import --change 'CMD ["/bin/bash"]' - "$name" >/dev/null
fi
echo "$name"
