"""`python -m daemon` runs the service."""

from daemon.service import main

raise SystemExit(main())
