"""`python -m bench` (what `make bench` runs): see bench/run.py and docs/bench.md."""

import sys

try:
    import e2e.cluster  # noqa: F401  (the datapath's cluster builder, hack/e2e)
except ModuleNotFoundError as err:
    sys.exit(f"bench: cannot import the e2e harness ({err}); run it as `make bench`, which "
             "puts hack/ on PYTHONPATH")

from bench.run import main  # noqa: E402

sys.exit(main())
