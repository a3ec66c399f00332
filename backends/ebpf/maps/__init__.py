"""The pinned BPF maps: their C layouts mirrored in ctypes (`layout`), the
bpf() calls BCC lacks (`libbpf`), the access the programmer needs (`access`),
their contents as typed values (`contents`), and the maps beside `services`
(`id_maps`, `counters`, `node_addresses`, `usage`)."""
