"""Windows without a real host: flaresim in process, virtual time, and model runs of a plan."""
