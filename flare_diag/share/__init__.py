"""What an operator installs besides the code: the systemd units (`systemd`) and the documentation (`docs`)."""
