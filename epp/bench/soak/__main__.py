"""`python -m epp.bench.soak`: see epp/bench/soak/__init__.py."""

import sys

from epp.bench.soak.cli import main

sys.exit(main())
