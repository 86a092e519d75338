"""The event log: schema, append-only hash-chained store, verification, projections."""
