#!/usr/bin/env bash
# The main job until a dataplane demo exists: replay a recorded stream to
# `to-print`, showing what a backend would program after each sync.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KPNG_PY="$ROOT/.venv/bin/kpng-py"
RECORDING="${1:-$ROOT/tests/streams/dual-stack.jsonl}"
WORK="$(mktemp -d)"
SOCK="$WORK/brain.sock"
trap 'kill "$REPLAY_PID" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT

"$KPNG_PY" replay -i "$RECORDING" to-api --listen "unix://$SOCK" 2>"$WORK/replay.log" &
REPLAY_PID=$!
for _ in $(seq 50); do [[ -S "$SOCK" ]] && break; sleep 0.1; done
SYNCS="$(grep -c '"Sync"' "$RECORDING")"
echo "replaying $RECORDING ($SYNCS change sets) to kpng-py local ... to-print" >&2
"$KPNG_PY" local --api "unix://$SOCK" --error-delay 0.1 --exit-after "$SYNCS" to-print
