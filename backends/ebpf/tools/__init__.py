"""The operator's tools: `kpng-py ebpf dump` (what the pinned maps hold)
and `kpng-py ebpf trace` (every translation, live)."""
