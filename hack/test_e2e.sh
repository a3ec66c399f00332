#!/usr/bin/env bash
# The end-to-end suite (docs/e2e.md):
#   hack/test_e2e.sh -i ipv4|ipv6|dual -b ebpf|userspace [-t service|nodeport] [-d] [-k]
#   hack/test_e2e.sh -a [-j N]   both topologies, every mode with every built-in backend, N runs at a time
# Needs root and hack/setup.sh. The logic lives in hack/e2e/ (Python).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="$ROOT/.venv/bin/python"
if [[ ! -x "$PYTHON" ]]; then
    echo "test_e2e.sh: $PYTHON is missing; run hack/setup.sh first" >&2
    exit 2
fi
exec "$PYTHON" "$ROOT/hack/run_e2e.py" "$@"
