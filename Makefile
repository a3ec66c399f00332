# The two commands: `make demo` (the main job) and `make test` (the suite).
# Both run hack/setup.sh first, which installs what is missing and is a no-op
# when everything is in place.
VENV := .venv
PYTEST := $(VENV)/bin/pytest
TEST_WORKERS ?= 2

.PHONY: setup demo test lint unit e2e bench image clean

setup:
	@hack/setup.sh

demo: setup
	@hack/demo.sh

# Everything CI runs: the linters (ruff, mypy), unit and stream tests, kernel
# tests, the e2e suite.
# pytest runs on two workers (the suite is CPU-bound; every kernel object a
# test makes is named after its process, lab/names.py, so workers never meet).
test: setup lint
	$(PYTEST) -q -ra -n $(TEST_WORKERS)
	hack/test_e2e.sh -a
	hack/test_e2e.sh -a -c kube

# ruff over the whole tree, then mypy over the packages and the tests (the
# rules of both: pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The end-to-end suite: every IP mode with every built-in backend, the
# checks' states in a state file, then through a Kubernetes API server (docs/e2e.md).
e2e: setup
	hack/test_e2e.sh -a
	hack/test_e2e.sh -a -c kube

# The benchmarks (docs/bench.md), not part of `make test`; e.g.
# make bench BENCH_ARGS="--quick"    (a few minutes)
bench: setup
	$(VENV)/bin/python -m bench $(BENCH_ARGS)

# The container image of this tree, tagged with its build version; prints the
# image to push and deploy (docs/deploy.md), e.g.
# make image IMAGE_REPOSITORY=registry.example/kpng-py
IMAGE_REPOSITORY ?= kpng-py
image:
	@hack/image.sh $(IMAGE_REPOSITORY)

unit: setup
	$(PYTEST) -q -ra -n $(TEST_WORKERS) -m "not kernel"

clean:
	rm -rf $(VENV) build *.egg-info kpng_py/api/localv1_pb2.py kpng_py/api/localv1_pb2.pyi
