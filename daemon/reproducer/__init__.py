"""The CPU reproducer: a window's requests replayed through the host-cache model."""
