"""The process's one TLS context, shared by every HTTP client the daemon makes."""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying context (its CA bundle, or SSL_CERT_FILE / SSL_CERT_DIR), built once:
    building one loads the whole CA store, tens of milliseconds of CPU, and every client made
    without one builds its own (a window makes several; a pool of daemons on one machine felt it)."""
    return httpx.create_ssl_context()
