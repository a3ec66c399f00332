"""`python -m bench` (what `make bench` runs): see bench/run.py and docs/bench.md."""

import sys

from bench.run import main

sys.exit(main())
