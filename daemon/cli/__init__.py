"""The `flare-diag` command line: parsing, the control-socket client, the live view and the offline tools."""
