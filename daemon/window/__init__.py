"""One window's run: its setup and preflight, the runner that executes the policy, and its recovery."""
