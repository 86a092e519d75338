"""`flare-diagd`: the long-running service. Not built yet: it says so and exits non-zero."""

from __future__ import annotations

import sys


def main() -> int:
    print("flare-diagd: the service (control socket, systemd notify, recovery) is not implemented in this"
          " build; use `flare-diag rehearse` or `flare-diag run` in the foreground", file=sys.stderr)
    return 1
