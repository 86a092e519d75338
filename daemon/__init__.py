"""The imperative shell: runner, adapters, service, control socket and CLI."""
