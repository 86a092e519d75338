"""`python -m flare_diag.daemon` runs the service."""

from flare_diag.daemon.service.server import main

raise SystemExit(main())
