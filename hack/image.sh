#!/usr/bin/env bash
# Build the kpng-py image from this checkout, tagged with its build version,
# and print the image (REPOSITORY:TAG) on stdout: what to push, put in
# deploy/*.yaml or give `kubectl set image` (docs/deploy.md).
#
#   hack/image.sh [--tag-only] [REPOSITORY]     (default REPOSITORY: kpng-py)
#
# The version comes from git here (kpng_py/cmd/version.py: the base version, the
# commits in HEAD's history, the commit, ".dirty" with changes not committed)
# and goes to `docker build` as KPNG_PY_VERSION: the build context has no .git.
# --tag-only prints the image without building it. Docker's output goes to stderr.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

log() { printf 'image: %s\n' "$*" >&2; }

build=1
if [[ ${1:-} == --tag-only ]]; then
    build=0
    shift
fi
if (($# > 1)) || [[ ${1:-} == -* ]]; then
    log "usage: hack/image.sh [--tag-only] [REPOSITORY]"
    exit 2
fi
repository="${1:-kpng-py}"

# kpng_py.cmd.version needs only the standard library: no venv required.
version="$(cd "$ROOT" && "$PYTHON" -m kpng_py.cmd.version)"
tag="$(cd "$ROOT" && "$PYTHON" -m kpng_py.cmd.version --image-tag)"
image="$repository:$tag"
if [[ $version == *.dirty ]]; then
    log "the tree has changes not committed: $image names no commit of its own; commit first"
fi
if ((build)); then
    log "building $image (kpng-py $version)"
    docker build -f "$ROOT/deploy/Dockerfile" --build-arg "KPNG_PY_VERSION=$version" \
        -t "$image" "$ROOT" >&2
fi
echo "$image"
