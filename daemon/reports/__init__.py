"""Reports built from a log and published beside it, and comparisons of repeated windows."""
