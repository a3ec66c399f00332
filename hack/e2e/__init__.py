"""The end-to-end suite: a throwaway cluster made of network namespaces, real
servers and clients, the built-in brain and a backend (docs/e2e.md)."""
