"""`flare-diagd`: the service, its control protocol, its journal lines, metrics and systemd notifications."""
