"""Installed as flare_diag.share.docs: the operator documentation, shipped as package data (`flare-diag share`)."""
