"""Helpers for tests that need the kernel: namespaces, cgroups, servers."""
