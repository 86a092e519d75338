"""`python -m flare_diag.daemon.cli` runs the command line."""

import sys

from flare_diag.daemon.cli.commands import main

sys.exit(main())
