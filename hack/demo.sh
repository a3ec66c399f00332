#!/usr/bin/env bash
# The main job (`make demo`): a small cluster in network namespaces with real
# servers, the built-in brain on a state file, the eBPF backend, and a client
# pod reaching ClusterIPs; then `kpng-py ebpf dump`; then everything is torn
# down. Needs root and hack/setup.sh. Logic: hack/e2e/demo.py.
#   hack/demo.sh [-i ipv4|ipv6|dual] [--keep]    (make demo KEEP=1 keeps it up too)
#   hack/demo.sh --down                          (leftovers of a demo killed hard)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT/hack"  # `python -m` finds the harness package (e2e) here
exec "$ROOT/.venv/bin/python" -m e2e.demo "$@"
