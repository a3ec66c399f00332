"""What the tests share: helpers, constants and fixtures, one module a topic
(namespaces, cgroups and servers for the kernel tests among them). No test
module imports another test module or a conftest.py: it imports from here."""
