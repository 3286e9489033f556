#!/usr/bin/env bash
# A stand-in for the official python:3.11-slim image, made of Debian's packages where no registry of base images can
# be reached (CI here): a Debian bookworm root file system (mmdebstrap, minbase) with Debian's python3 (3.11) in a
# virtual environment at /usr/local, so /usr/local/bin/python and pip are where the official image has them; imported
# into podman as $TAG.  The Dockerfile builds on it with --build-arg BASE=$TAG.  About 250 MB; needs root, mmdebstrap
# and podman, and Debian's package mirror.  Usage: bash containers/python-base.sh [TAG]
set -euo pipefail
tag=${1:-localhost/olu-standin-python:3.11}
mirror=${OLU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${OLU_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
tmp=$(mktemp -d /var/tmp/olu-base.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  --aptopt='Acquire::Check-Valid-Until "false"' \
  --customize-hook='chroot "$1" python3 -m venv /usr/local' \
  bookworm "$tmp/root.tar" \
  "deb $mirror bookworm main" "deb $mirror bookworm-updates main" "deb $security bookworm-security main"
podman import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$tmp/root.tar" "$tag"
