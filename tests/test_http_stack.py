"""The HTTP stack every host adapter sends through, as installed with flare-diag."""

from __future__ import annotations

import sys

import anyio


def test_httpcores_backend_detection_finds_sniffio_rather_than_failing_an_import_at_every_lock():
    # httpcore 1.0.x imports sniffio inside current_async_library(), which every AsyncLock and AsyncEvent
    # setup calls; without sniffio (anyio >= 4.11 no longer brings it) Python retries the failed import
    # each time, searching sys.path (encode/httpcore#1103). flare-diag depends on sniffio for that reason.
    from httpcore._synchronization import current_async_library

    async def detect() -> str:
        return current_async_library()

    assert anyio.run(detect) == "asyncio" and "sniffio" in sys.modules
