"""The fleet: every host's events shipped to PostgreSQL, pool leases, and the views over them.

Nothing here is in a window's safety path except the lease taken before anything changes: each
host's SQLite log stays the source of truth, and shipping never blocks, slows or aborts a window."""
