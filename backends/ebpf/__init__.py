"""The eBPF backend (`to-ebpf`): a socket-level ClusterIP load balancer made of
cgroup sock_addr programs and pinned BPF maps. Design: docs/ebpf.md."""
