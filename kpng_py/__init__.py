"""kpng-py: a KPNG backend in Python.

Layout (docs/architecture.md): ``api`` is the wire (generated from
proto/localv1.proto), ``model`` the values every backend programs,
``transport`` the addresses and TLS of both ends of a stream; the packages
follow the flow: ``watch`` (a brain's stream in) -> ``state`` (the node's
state, its changes) -> ``dataplane`` (the backend contract and applier),
with ``serve`` (streams out), ``brain`` (the built-in brain), ``healthcheck``,
``metrics``, ``node``, ``runtime`` and ``cmd`` (the command line). Dataplanes
live in the top-level ``backends`` package.
"""


# The base version, the one place it is set (pyproject.toml reads it): a
# build's version adds the commits and the commit it was built from
# (kpng_py/cmd/version.py).
__version__ = "0.1.0"
