#!/usr/bin/env bash
# Container entrypoint: make kernel headers findable by BCC, then run kpng-py.
#
# Preferred: the node's own headers, which match its kernel. The DaemonSet
# mounts the node's /lib/modules and /usr/src under $HOST_ROOT (default /host);
# the node's build/source links point into its /usr/src, so they are re-pointed
# under $HOST_ROOT. Fallback: the image's Debian headers (hack/setup.sh
# headers), which work for the BPF programs kpng-py compiles (docs/deploy.md).
set -euo pipefail
HOST_ROOT="${HOST_ROOT:-/host}"
release="$(uname -r)"
node_modules="$HOST_ROOT/lib/modules/$release"

host_path() { # where a node's /lib/modules entry points, as seen in this container
    local target
    if [[ ! -L $1 ]]; then
        echo "$1"
    elif target="$(readlink "$1")" && [[ $target == /* ]]; then
        echo "$HOST_ROOT$target"
    else
        echo "$(dirname "$1")/$target"
    fi
}

if [[ -e "$node_modules/build" ]] && build="$(host_path "$node_modules/build")" \
    && [[ -d "$build/include" ]]; then
    mkdir -p "/lib/modules/$release"
    ln -sfn "$build" "/lib/modules/$release/build"
    if source="$(host_path "$node_modules/source" 2>/dev/null)" && [[ -d $source ]]; then
        ln -sfn "$source" "/lib/modules/$release/source"
    fi
    echo "kpng-py: using the node's kernel headers at $build" >&2
else
    /opt/kpng-py/hack/setup.sh headers
fi
exec /opt/kpng-py/.venv/bin/kpng-py "$@"
