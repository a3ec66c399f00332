"""What hack/test_e2e.sh runs. Started as a script, Python puts this
directory first on the import path, so the harness package (e2e) is found
whatever the caller's working directory is (a relative --logs-dir stays
relative to it)."""

import sys

from e2e.cli import main

sys.exit(main())
