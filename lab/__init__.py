"""The lab: throwaway nodes made of network namespaces, cgroups and real
servers, for the e2e suite (hack/e2e), the benchmarks (bench/) and the kernel
tests alike (docs/architecture.md, "Packages"), and how a run
drives each of kpng-py's backends (backends.py).

Every object it creates carries its owner's pid (names.py), is removed when
its owner ends, also on failure and Ctrl-C, and is swept (teardown.py) when
its owner was killed. Client namespaces have no route out of the lab.
"""
