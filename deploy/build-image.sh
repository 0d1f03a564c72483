#!/bin/sh
# Build the server image with podman: deploy/build-image.sh [IMAGE]  (from the repository root;
# `make image` runs it). Settings from the environment:
#   BASE_IMAGE  the base (a Python 3.11+ image). Unset: a Debian bookworm base bootstrapped
#               here with mmdebstrap (deploy/bootstrap-base.sh), for hosts without a registry.
#   CACHE_DIR   where that base's tarball is kept between runs (.bidi-responses/image-base).
#   CONTAINERS_CONF  podman's settings (default: deploy/containers.conf).
# pip inside the build reaches the package index as this host's pip does: its index settings
# (PIP_* variables, else `pip config`) are passed on when they are http(s) URLs, and the
# host's CA bundle is mounted for the RUN steps (the CA of a TLS-inspecting proxy, say).
set -eu
image=${1:-localhost/bidi-responses:latest}
here=$(cd "$(dirname "$0")" && pwd)
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
base=${BASE_IMAGE:-}
if [ -z "$base" ]; then
    base=$("$here/bootstrap-base.sh" "${CACHE_DIR:-.bidi-responses/image-base}")
fi
options=""
pip_setting() {  # $1: PIP_* variable, $2: pip config key, $3: pip option
    eval "value=\${$1:-}"
    if [ -z "$value" ] && command -v python3 >/dev/null; then
        value=$(python3 -m pip config get "global.$2" 2>/dev/null || true)
    fi
    for item in $value; do
        case $3:$item in
            # Only network indexes mean the same inside the build; local paths do not exist there.
            --trusted-host:* | *:http://* | *:https://*) options="$options $3 $item" ;;
        esac
    done
}
pip_setting PIP_INDEX_URL index-url --index-url
pip_setting PIP_EXTRA_INDEX_URL extra-index-url --extra-index-url
pip_setting PIP_TRUSTED_HOST trusted-host --trusted-host
set --
bundle=/etc/ssl/certs/ca-certificates.crt
if [ -f "$bundle" ]; then
    set -- --volume "$bundle:$bundle:ro"
    options="$options --cert $bundle"
fi
# The image's version and commit labels (empty outside a git checkout).
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)
revision=$(git rev-parse HEAD 2>/dev/null || true)
exec podman build --layers --file "$here/Containerfile" --ignorefile "$here/Containerfile.dockerignore" \
    --build-arg "BASE_IMAGE=$base" --build-arg "PIP_OPTIONS=${options# }" \
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision" --tag "$image" "$@" .
