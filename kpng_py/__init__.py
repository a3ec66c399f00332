"""kpng-py: a KPNG backend in Python.

Layout: ``kpng_py.api`` is the wire (generated from proto/localv1.proto),
``kpng_py.model`` the state model backends program, ``kpng_py.state`` the
node's state and change tracker, ``kpng_py.client``/``kpng_py.server`` the two
ends of the localv1 Watch stream; dataplanes live in the top-level ``backends``
package.
"""

# The base version, the one place it is set (pyproject.toml reads it): a
# build's version adds the commits and the commit it was built from
# (kpng_py/version.py).
__version__ = "0.1.0"
