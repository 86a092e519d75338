"""Installed as flare_diag.share.systemd: the unit, sysusers and tmpfiles files, shipped as package data (`flare-diag share`)."""
