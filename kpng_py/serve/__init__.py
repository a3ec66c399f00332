"""The brain's end of localv1 Watch streams, shared by the built-in brain
and `replay`: the server and its listening sockets, and recordings of
streams (`record` writes them, `replay` serves them)."""
