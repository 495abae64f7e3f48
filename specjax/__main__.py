"""``python -m specjax`` runs the command-line tool."""

import sys

from specjax.cli import main

sys.exit(main())
