# The two commands: `make demo` (the main job) and `make test` (the suite).
# Both run hack/setup.sh first, which installs what is missing and is a no-op
# when everything is in place.
VENV := .venv
PYTEST := $(VENV)/bin/pytest

.PHONY: setup demo test unit kernel e2e clean

setup:
	@hack/setup.sh

demo: setup
	@hack/demo.sh

# Everything CI runs: unit and stream tests, kernel tests, the e2e suite.
test: setup
	$(PYTEST) -q -ra

unit: setup
	$(PYTEST) -q -ra -m "not kernel"

clean:
	rm -rf $(VENV) build *.egg-info kpng_py/api/localv1_pb2.py kpng_py/api/localv1_pb2.pyi
