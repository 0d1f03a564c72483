#!/bin/sh
# Build a Debian bookworm base image with Python locally, for hosts that reach Debian's package
# mirror but no image registry: mmdebstrap, then `podman import`. The tarball is kept in
# CACHE_DIR so a later run (or a reset image store) imports it again without downloading.
#   deploy/bootstrap-base.sh IMAGE_NAME CACHE_DIR
set -eu
image=${1:?image name}
cache=${2:?cache directory}
if podman image exists "$image"; then
    exit 0
fi
mkdir -p "$cache"
tar="$cache/bookworm-python3.tar"
if [ ! -s "$tar" ]; then
    # The mirror this host's apt uses (deb822 .sources or one-line lists), else Debian's own.
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
        2>/dev/null | awk '
            /^URIs:/ && $2 ~ /\/debian\/?$/ { print $2; exit }
            /^deb / && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/) { print $i; exit } }
        ')
    mirror=${mirror:-http://deb.debian.org/debian}
    mmdebstrap --quiet --format=tar --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$tar.part" "$mirror"
    mv "$tar.part" "$tar"
fi
podman import --quiet "$tar" "$image" >/dev/null
