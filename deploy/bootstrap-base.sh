#!/bin/sh
# Build a Debian bookworm base image with Python locally, for hosts that reach Debian's package
# mirror but no image registry: mmdebstrap, then `podman import`. Prints the image's name, which
# carries a hash of the bootstrap's settings (a changed recipe makes a new base). The tarball is
# kept in CACHE_DIR, so a later run, or an emptied image store, imports it without downloading.
#   deploy/bootstrap-base.sh CACHE_DIR
set -eu
cache=${1:?cache directory}
# The smallest Debian that runs the server: python3 with venv and CA certificates, without
# recommended packages, manuals, documentation (the copyright files stay) or translations.
set -- --variant=minbase --include=python3,python3-venv,ca-certificates \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*'
recipe=$(printf '%s\n' "$@" | sha256sum | cut -c1-12)
image=localhost/bidi-responses-base:bookworm-$recipe
if podman image exists "$image"; then
    echo "$image"
    exit 0
fi
mkdir -p "$cache"
tar="$cache/bookworm-$recipe.tar"
if [ ! -s "$tar" ]; then
    # The mirror this host's apt uses (deb822 .sources or one-line lists), else Debian's own.
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
        2>/dev/null | awk '
            /^URIs:/ && $2 ~ /\/debian\/?$/ { print $2; exit }
            /^deb / && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/) { print $i; exit } }
        ')
    mirror=${mirror:-http://deb.debian.org/debian}
    mmdebstrap --quiet --format=tar "$@" bookworm "$tar.part" "$mirror" >&2
    mv "$tar.part" "$tar"
fi
podman import --quiet "$tar" "$image" >/dev/null
echo "$image"
