"""`python -m flare_diag.daemon` runs the service."""

from flare_diag.daemon.service import main

raise SystemExit(main())
