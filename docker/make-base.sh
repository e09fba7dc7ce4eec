#!/bin/sh
# The base image the Dockerfiles build FROM by default, made from the Debian
# archive alone (no container registry): a Debian 12 minbase root from
# mmdebstrap, slimmed like the registry's debian:bookworm-slim (no manual
# pages, documentation except copyright files, or translations, also for
# what is installed later), imported into the container engine.
#   docker/make-base.sh [NAME]            (root; default NAME crowdtrain-base:bookworm)
# CT_ENGINE picks the engine (podman, else docker); CT_MIRROR the Debian
# mirror (default http://deb.debian.org). Where a registry is reachable,
# skip this and build with --build-arg BASE=debian:bookworm-slim instead.
set -eu
name=${1:-crowdtrain-base:bookworm}
engine=${CT_ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}
mirror=${CT_MIRROR:-http://deb.debian.org}
command -v mmdebstrap >/dev/null || { echo "make-base: mmdebstrap not found (apt-get install mmdebstrap)" >&2; exit 1; }
command -v "$engine" >/dev/null || { echo "make-base: $engine not found" >&2; exit 1; }
# mmdebstrap writes a tarball to stdout; dpkg's path-exclude lines stay in
# the image (/etc/dpkg/dpkg.cfg.d/99mmdebstrap), as in debian:*-slim.
mmdebstrap --quiet --variant=minbase \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --aptopt='Acquire::Languages "none"' \
  bookworm - \
  "deb $mirror/debian bookworm main" \
  "deb $mirror/debian bookworm-updates main" \
  "deb $mirror/debian-security bookworm-security main" |
  "$engine" import --change 'CMD ["bash"]' - "$name" >/dev/null
echo "$name"
