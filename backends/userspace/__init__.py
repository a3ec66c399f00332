"""`to-userspace`: a pure-Python ClusterIP proxy for hosts without eBPF.

Each ClusterIP is made local to the node on a dedicated dummy interface
(`addresses`), and each ClusterIP:port gets a TCP or UDP listener (`tcp`,
`udp`) that forwards to an endpoint chosen by Maglev consistent hashing
(`maglev`, `picker`). Design notes: docs/userspace.md.
"""
