"""``python -m samplechain``: the command line."""

import sys

from samplechain.cli import main

sys.exit(main())
