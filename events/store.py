"""The append-only event store: one writer that group-commits durable, hash-chained batches on its database thread."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import hashlib
import logging
import os
import sqlite3
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import anyio
import msgspec

from flare_diag.events.base import Event, _encoder
from flare_diag.events.chain import DOMAIN_TAG, GENESIS, _fixed
from flare_diag.events.checkpoint import CheckpointSlots, default_path
from flare_diag.events.dbthread import DbThread
from flare_diag.events.envelope import COLUMNS, Envelope
from flare_diag.events.sqlschema import BULK_INSERT, DDL, FORMAT, STORE_VERSION, NotAnEventLog

T = TypeVar("T")
_log = logging.getLogger("flare_diag.store")

Clock = Callable[[], tuple[int, int]]


def system_clock() -> tuple[int, int]:
    return time.monotonic_ns(), time.time_ns()


class StoreClosed(RuntimeError):
    """An append was attempted on a closed store."""


class StoreWriteError(RuntimeError):
    """A batch could not be committed; none of its events were acknowledged."""


_Row = tuple[str, int, str, "int | None", bytes, int, int]


class _Chained:
    """One batch chained onto the log, in the form BULK_INSERT takes; its rows are built only when read."""

    __slots__ = ("meta", "payloads", "hashes")

    def __init__(self, meta: list[tuple[Any, ...]], payloads: list[bytes], hashes: list[bytes]) -> None:
        self.meta = meta  # per event: seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, offset, length
        self.payloads = payloads
        self.hashes = hashes  # the previous head, then each event's hash: event k's prev_hash is hashes[k]

    def __len__(self) -> int:
        return len(self.meta)

    @property
    def head(self) -> tuple[int, bytes]:
        return self.meta[-1][0], self.hashes[-1]

    def bulk(self) -> tuple[bytes, bytes, bytes]:
        return _encode_meta(self.meta), b"".join(self.payloads), b"".join(self.hashes)

    def envelopes(self, start: int = 0, stop: int | None = None) -> list[Envelope]:
        meta, payloads, hashes = self.meta, self.payloads, self.hashes
        return [_envelope(meta[k], payloads[k], hashes[k], hashes[k + 1])
                for k in range(*slice(start, stop).indices(len(meta)))]


def _envelope(m: tuple[Any, ...], payload: bytes, prev: bytes, hash_: bytes) -> Envelope:
    """An event's envelope from its batch's meta (seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq)."""
    return Envelope(m[0], m[1], m[2], m[3], m[4], m[5], m[6], payload, prev, hash_)


class _Receipt:
    """The envelopes of one committed group, built only when read (the hot path rarely reads them)."""

    __slots__ = ("_chained", "_start", "_n")

    def __init__(self, chained: _Chained, start: int, n: int) -> None:
        self._chained, self._start, self._n = chained, start, n

    def __len__(self) -> int:
        return self._n

    def envelopes(self, start: int = 0, stop: int | None = None) -> list[Envelope]:
        lo, hi, _ = slice(start, stop).indices(self._n)
        return self._chained.envelopes(self._start + lo, self._start + max(lo, hi))


class _Group:
    """Submissions that share one future: a group is committed whole, in one transaction."""

    __slots__ = ("rows", "fut", "size")

    def __init__(self, fut: asyncio.Future[_Receipt]) -> None:
        self.rows: list[_Row] = []
        self.fut = fut
        self.size = 0  # payload bytes


class _Marker(enum.Enum):
    STOP = 0  # the queue's last item: the writer ends after the commits before it


_STOP: Final = _Marker.STOP
_encode = _encoder.encode
_encode_meta = msgspec.json.Encoder().encode
# A batch also stops growing past this many payload bytes: SQLite caps one bound blob at 1 GB.
_MAX_BATCH_BYTES = 64 << 20
# A log whose commits do not wait for the disk (a rehearsal's) has its checkpoint replaced after
# this many commits and when it closes, not after each: creating and renaming a file per commit
# was an eighth of a rehearsal's CPU (in virtual time each idle moment of the loop is a commit).
UNDURABLE_CHECKPOINT_EVERY = 32
# SQLite checkpoints its WAL inside the commit that passes this many pages (its default); the store does
# it on the database thread after that commit is answered.
WAL_CHECKPOINT_PAGES = 1000
_TAGS: dict[type, tuple[str, int]] = {}


def _tag_of(event: Event) -> tuple[str, int]:
    cls = type(event)
    tv = _TAGS.get(cls)
    if tv is None:
        tv = _TAGS[cls] = (cls.__struct_config__.tag, cls.schema_v)  # type: ignore[assignment]  # every event class declares a str tag and an int schema_v
    return tv  # type: ignore[return-value]  # as above: (tag, schema_v)


class EventStore:
    """Appends are queued, stamped in submission order, and acknowledged only once committed.

    One writer task owns the connection: it drains whatever is queued, hashes it onto the chain,
    writes it in one `BEGIN IMMEDIATE` transaction with `synchronous=FULL`, then resolves the
    waiters. Callers on a hot path use `submit` and need not await the fsync.
    """

    def __init__(self, db: DbThread, path: Path, checkpoint_path: Path, clock: Clock,
                 seq: int, head_hash: bytes, max_batch: int, durable: bool = True) -> None:
        self._db = db
        # the commit itself, on the database thread (a seam: a test fills the disk here)
        self._transaction: Callable[[sqlite3.Connection, _Chained], None] = _write_transaction
        self.path = path
        self.checkpoint_path = checkpoint_path
        self._checkpoints = CheckpointSlots(checkpoint_path)
        self._clock = clock
        self._seq = seq
        self._head = head_hash
        self._tent_seq, self._tent_head = seq, head_hash  # hashed, maybe not yet committed
        self._prefixes: dict[tuple[str, str], bytes] = {}
        self._max_batch = max_batch
        self._queue: deque[_Group | Literal[_Marker.STOP]] = deque()
        self._open: _Group | None = None
        self._wake = asyncio.Event()
        self._closed = False
        self._listeners: list[Callable[[list[Envelope]], None]] = []
        self.checkpoint_error: str | None = None  # why the last checkpoint write failed, if it did
        self.checkpoint_key: bytes | None = None  # signs each checkpoint (HMAC) when set
        self._checkpoint_every = 1 if durable else UNDURABLE_CHECKPOINT_EVERY
        self._uncheckpointed = 0  # commits since the checkpoint was last replaced
        self._wal_pages = 0  # pages written to the WAL since it was last checkpointed (an estimate)
        self._said: deque[str | None] = deque()  # checkpoint outcomes from the database thread, in order
        self._lock_fd: int | None = None  # the writer lock, held from open to close
        self._failed: StoreWriteError | None = None  # the commit failure that stopped writes (fail-stop)
        self._loop = asyncio.get_running_loop()
        # the writer and its in-flight commit live in the store's own task group, entered by `open`
        # and left by `close` (in the task that opened the store): nothing the store started
        # outlives it, and a writer that died would cancel its opener rather than wedge every append
        self._tg = anyio.create_task_group()

    @classmethod
    async def open(cls, path: str | os.PathLike[str], *, checkpoint_path: str | os.PathLike[str] | None = None,
                   clock: Clock = system_clock, max_batch: int = 65_536, durable: bool = True,
                   lock: bool = True) -> EventStore:
        """`durable`: each commit waits for the disk (synchronous=FULL); False keeps the log consistent
        on a crash of the process but not of the machine (synchronous=NORMAL, WAL): for a rehearsal,
        whose simulated host ends with the process anyway.

        `lock`: hold the log's writer lock (`LOG.lock`) while open, so that no second writer (a
        second daemon, `log archive`) can fork the chain; False only for a caller that holds it."""
        path = Path(path)
        cp = Path(checkpoint_path) if checkpoint_path is not None else default_path(path)
        lock_fd = _take_writer_lock(path) if lock else None
        if lock and lock_fd is None:
            raise LogBusy(f"{path}: another process is writing this log (a daemon, a window or `log archive`)")
        try:
            db = await DbThread.open(path)
        except BaseException:
            _release(lock_fd)
            raise
        try:
            seq, head = await db.call(_prepare, path, durable)
        except BaseException:
            await db.close()
            _release(lock_fd)
            raise
        store = cls(db, path, cp, clock, seq, head, max_batch, durable)
        store._lock_fd = lock_fd
        await store._tg.__aenter__()
        store._tg.start_soon(store._write_loop, name="event-store-writer")
        return store

    def subscribe(self, listener: Callable[[list[Envelope]], None]) -> Callable[[], None]:
        """Calls `listener(envelopes)` on the loop after each commit; returns the unsubscribe function.

        A listener must not block; it is how `watch` and live progress follow the log without
        reading it back from the file.
        """
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    @property
    def head(self) -> tuple[int, bytes]:
        """The last acknowledged (seq, hash)."""
        return self._seq, self._head

    def _enqueue(self, rows: list[_Row], size: int) -> tuple[asyncio.Future[_Receipt], int]:
        # Submissions join the open group until the writer takes it, so the hot path allocates no
        # future (and gives the garbage collector nothing new to scan) per event. The writer waits
        # only on an empty queue, so waking it when a group joins the queue is enough.
        group = self._open
        if group is None:
            group = self._open = _Group(self._loop.create_future())
            self._queue.append(group)
            self._wake.set()
        start = len(group.rows)
        group.rows += rows
        group.size += size
        if len(group.rows) >= self._max_batch or group.size >= _MAX_BATCH_BYTES:
            self._open = None
        return group.fut, start

    def _stamp(self, mono_ns: int | None, wall_ns: int | None) -> tuple[int, int]:
        if self._closed:
            raise StoreClosed(f"{self.path}: event store is closed")
        if mono_ns is None or wall_ns is None:
            m, w = self._clock()
            return (m if mono_ns is None else mono_ns), (w if wall_ns is None else wall_ns)
        return mono_ns, wall_ns

    def submit(self, event: Event, *, window_id: str = "", causation_seq: int | None = None,
               mono_ns: int | None = None, wall_ns: int | None = None) -> asyncio.Future[_Receipt]:
        """Queues one event; the returned future resolves once it is durable (or the commit failed).

        The future is shared by every submission of the same commit group; `append` returns the
        event's own envelope.
        """
        # the hot path (every observation of a window): _stamp, _tag_of and _enqueue inlined
        if self._closed:
            raise StoreClosed(f"{self.path}: event store is closed")
        if mono_ns is None or wall_ns is None:
            m, w = self._clock()
            mono_ns, wall_ns = (m if mono_ns is None else mono_ns), (w if wall_ns is None else wall_ns)
        tv = _TAGS.get(type(event)) or _tag_of(event)
        payload = _encode(event)
        group = self._open
        if group is None:
            group = self._open = _Group(self._loop.create_future())
            self._queue.append(group)
            self._wake.set()
        rows = group.rows
        rows.append((tv[0], tv[1], window_id, causation_seq, payload, mono_ns, wall_ns))
        group.size += len(payload)
        if len(rows) >= self._max_batch or group.size >= _MAX_BATCH_BYTES:
            self._open = None
        return group.fut

    def submit_many(self, events: Iterable[Event], *, window_id: str = "", causation_seq: int | None = None,
                    mono_ns: int | None = None, wall_ns: int | None = None,
                    caused_by_first: bool = False) -> asyncio.Future[_Receipt]:
        """Queues events that get consecutive seqs, committed in one transaction.

        caused_by_first: every event after the first gets the first one's seq as its causation_seq
        (an input and the decisions it caused), known only once the store numbers them.
        """
        return self._submit_many(events, window_id, causation_seq, mono_ns, wall_ns, caused_by_first)[0]

    def _submit_many(self, events: Iterable[Event], window_id: str, causation_seq: int | None,
                     mono_ns: int | None, wall_ns: int | None,
                     caused_by_first: bool = False) -> tuple[asyncio.Future[_Receipt], int, int]:
        mono_ns, wall_ns = self._stamp(mono_ns, wall_ns)
        rows = []
        size = 0
        for i, e in enumerate(events):
            tag, v = _tag_of(e)
            # a negative causation is an offset back to the cause inside this submission; the
            # hashing pass turns it into that event's seq before anything is hashed or stored
            caus = -i if caused_by_first and i else causation_seq
            payload = _encode(e)
            size += len(payload)
            rows.append((tag, v, window_id, caus, payload, mono_ns, wall_ns))
        if not rows:  # still a barrier: resolves after everything submitted before it
            group = self._open
            if group is None:
                fut = self._loop.create_future()
                self._queue.append(_Group(fut))
                self._wake.set()
                return fut, 0, 0
            return group.fut, len(group.rows), 0
        fut, start = self._enqueue(rows, size)
        return fut, start, len(rows)

    async def append(self, event: Event, *, window_id: str = "", causation_seq: int | None = None,
                     mono_ns: int | None = None, wall_ns: int | None = None) -> Envelope:
        """Appends one event and returns its envelope once it is durable."""
        fut, start, _n = self._submit_many((event,), window_id, causation_seq, mono_ns, wall_ns)
        return (await fut).envelopes(start, start + 1)[0]

    async def append_many(self, events: Sequence[Event], *, window_id: str = "", causation_seq: int | None = None,
                          mono_ns: int | None = None, wall_ns: int | None = None) -> list[Envelope]:
        """Appends events with consecutive seqs and returns their envelopes once durable."""
        fut, start, n = self._submit_many(events, window_id, causation_seq, mono_ns, wall_ns)
        return (await fut).envelopes(start, start + n)

    @property
    def failed(self) -> StoreWriteError | None:
        """The commit failure that stopped every later write, until `resume_writes`."""
        return self._failed

    def resume_writes(self) -> None:
        """Lets the next commit be tried again, from the last committed event (a retry after a
        failure: what failed must be submitted again, in order, by whoever submitted it)."""
        self._failed = None

    async def flush(self) -> None:
        """Waits until everything submitted so far is durable (or failed)."""
        await self.submit_many(())

    async def _write_loop(self) -> None:
        # Pipelined: while one batch is being written on the database thread, the next is gathered
        # and hashed on the loop. At most one commit is in flight, so acknowledgements stay ordered.
        queue = self._queue
        inflight: asyncio.Future[bool] | None = None
        stop = False
        while not stop:
            if not queue:
                if inflight is not None:
                    await inflight
                    inflight = None
                    continue
                self._wake.clear()
                await self._wake.wait()
                # Then two passes of the loop before the batch is gathered, so that the tasks the
                # submission woke (an observation's reader, then the policy's decisions on it) add
                # theirs: one commit for the moment rather than three. In virtual time every commit
                # is a round trip to the writer thread the clock waits for (3,399 commits in the
                # default rehearsal, 1,566 this way: 10% of its CPU); on the wall clock it is a
                # few microseconds before a commit that then waits for the disk.
                for _ in range(2):
                    await asyncio.sleep(0)
            batch, n, size = [], 0, 0
            while queue and n < self._max_batch and size < _MAX_BATCH_BYTES:
                item = queue.popleft()
                if item is _STOP:
                    stop = True
                    break
                if item is self._open:
                    self._open = None
                batch.append(item)
                n += len(item.rows)
                size += item.size
            if not batch:
                continue
            base = (self._tent_seq, self._tent_head)
            chained = self._hash_rows(batch, *base)
            if inflight is not None and not await inflight:
                chained = self._hash_rows(batch, self._seq, self._head)  # the previous batch failed
            inflight = self._commit(batch, chained)
        if inflight is not None:
            await inflight

    def _commit(self, batch: list[_Group], chained: _Chained) -> asyncio.Future[bool]:
        """Hands the batch to the database thread; the future says whether it committed. Its waiters are
        answered by the thread's own callback on the loop, as soon as COMMIT has returned."""
        done: asyncio.Future[bool] = self._loop.create_future()

        def answer(_result: object, error: BaseException | None) -> None:
            done.set_result(self._committed(batch, chained, error))
        if not chained:  # only barriers: everything before them is already settled
            answer(None, None)
        elif self._failed is not None:
            answer(None, self._failed)
        else:
            try:
                self._db.submit(self._run_transaction, chained, answer=answer, then=self._after_commit(batch, chained))
            except Exception as exc:
                answer(None, exc)
        return done

    def _run_transaction(self, conn: sqlite3.Connection, chained: _Chained) -> None:
        try:
            self._transaction(conn, chained)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _after_commit(self, batch: list[_Group], chained: _Chained) -> Callable[[sqlite3.Connection], None] | None:
        """What follows a commit on the database thread, after its waiters are answered: the checkpoint slot
        (every commit of a durable log), and a WAL checkpoint once about SQLite's own threshold of pages has
        been written since the last (so that no append waits for one)."""
        due = self._uncheckpointed + 1 >= self._checkpoint_every
        self._uncheckpointed = 0 if due else self._uncheckpointed + 1
        self._wal_pages += sum(g.size for g in batch) // 4096 + 3  # the rows, and the table's and indexes' leaves
        wal = self._wal_pages >= WAL_CHECKPOINT_PAGES
        if wal:
            self._wal_pages = 0
        if not due and not wal:
            return None
        checkpoint = (self._checkpoints, *chained.head, self.checkpoint_key) if due else None
        said = self._said

        def then(conn: sqlite3.Connection) -> None:
            if checkpoint is not None:
                said.append(_write_slot(checkpoint))
            if wal:
                _wal_checkpoint(conn)
        return then

    def _checkpoint_said(self, why: str | None) -> None:
        if why is not None and why != self.checkpoint_error:
            _log.error("checkpoint not written (the log is committed; the checkpoint lags it): %s", why)
        self.checkpoint_error = why

    def _hash_rows(self, batch: list[_Group], seq: int, prev: bytes) -> _Chained:
        """Chains the batch onto (seq, prev)."""
        # event_hash() inlined, with the (type, window) part of the preimage cached: the store's hot loop
        sha, pack, join, tag, pre = hashlib.sha256, _fixed.pack, b"".join, DOMAIN_TAG, self._prefixes
        meta: list[tuple[Any, ...]] = []
        payloads: list[bytes] = []
        hashes: list[bytes] = [prev]
        add_meta, add_payload, add_hash = meta.append, payloads.append, hashes.append
        off = 1
        for group in batch:
            for type_, v, wid, caus, payload, mono, wall in group.rows:
                seq += 1
                if caus is not None and caus < 0:
                    caus = seq + caus
                tw = pre.get((type_, wid))
                if tw is None:
                    t, w = type_.encode(), wid.encode()
                    tw = pre[(type_, wid)] = len(t).to_bytes(2, "big") + t + len(w).to_bytes(2, "big") + w
                prev = sha(join((tag, prev, pack(seq, v, mono, wall, -1 if caus is None else caus), tw, payload))).digest()
                n = len(payload)
                add_meta((seq, mono, wall, type_, v, wid, caus, off, n))
                add_payload(payload)
                add_hash(prev)
                off += n
        self._tent_seq, self._tent_head = seq, prev
        return _Chained(meta, payloads, hashes)

    def _committed(self, batch: list[_Group], chained: _Chained, error: BaseException | None) -> bool:
        """On the loop, as the database thread answers: settles the batch's waiters."""
        while self._said:
            self._checkpoint_said(self._said.popleft())
        if error is not None:  # the batch is lost as a whole; nobody was acknowledged
            self._tent_seq, self._tent_head = self._seq, self._head
            err = error if isinstance(error, StoreWriteError) else \
                StoreWriteError(f"{self.path}: commit of {len(chained)} events failed: {error}")
            # fail-stop: every later batch fails too, until `resume_writes`, so the log stays a
            # prefix of what was submitted (never a gap where a lost batch was)
            self._failed = self._failed or err
            for group in batch:
                if not group.fut.done():
                    group.fut.set_exception(err)
            return False
        if chained:
            self._seq, self._head = chained.head
            if self._listeners:
                self._tell_listeners(chained.envelopes())
        i = 0
        for group in batch:
            n = len(group.rows)
            if not group.fut.done():
                group.fut.set_result(_Receipt(chained, i, n))
            i += n
        return True

    def _tell_listeners(self, envs: list[Envelope]) -> None:
        for listener in list(self._listeners):
            try:
                listener(envs)
            except Exception:
                # a display's bug must not stop the writer, and with it every append of
                # the window: the listener is dropped and the failure logged
                windows = sorted({e.window_id for e in envs if e.window_id}) or ["none"]
                _log.exception("event store listener %s failed on window %s at seq %d and was dropped",
                               getattr(listener, "__qualname__", repr(listener)), ",".join(windows),
                               envs[0].seq)
                if listener in self._listeners:
                    self._listeners.remove(listener)

    async def iter(self, *, from_seq: int = 1, window_id: str | None = None,
                   types: Iterable[str] | None = None, chunk: int = 2048) -> AsyncIterator[Envelope]:
        """Committed events in seq order, optionally one window's or some types'; read a page at a time
        (by seq, so no cursor is left open on the database thread between pages)."""
        types = list(types) if types is not None else None
        while True:
            sql, args = select_sql(from_seq, window_id, types)
            rows = await self._db.call(_fetch, f"{sql} LIMIT ?", [*args, chunk])
            for r in rows:
                yield row_envelope(r)
            if len(rows) < chunk:
                return
            from_seq = rows[-1][0] + 1

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.append(_STOP)
        self._wake.set()
        try:
            await self._tg.__aexit__(None, None, None)  # the writer ends at _STOP, after the last commit
            if self._uncheckpointed:  # an undurable log's last commits: its checkpoint catches up
                self._uncheckpointed = 0
                self._said.append(await self._db.call(
                    _slot_call, (self._checkpoints, self._seq, self._head, self.checkpoint_key)))
        finally:
            try:
                await self._db.close()  # after every call made before, and what followed them
            finally:
                while self._said:
                    self._checkpoint_said(self._said.popleft())
                self._checkpoints.close()
                _release(self._lock_fd)

    async def __aenter__(self) -> EventStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _prepare(conn: sqlite3.Connection, path: Path, durable: bool) -> tuple[int, bytes]:
    """Sets the log up (WAL, the schema, its format marker) and returns its head: on the database thread."""
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        # the store checkpoints the WAL itself, after a commit is answered (EventStore._after_commit);
        # SQLite's own, inside a commit, stays as a bound should those ever fail
        conn.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES * 10}")
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in split_ddl(DDL):  # executescript would commit; run the DDL inside our transaction
                conn.execute(stmt)
            _check_meta(conn, path)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        rows = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchall()
    except sqlite3.DatabaseError as exc:
        raise NotAnEventLog(f"{path}: not a flare-diag event log ({exc})") from None
    return (rows[0][0], bytes(rows[0][1])) if rows else (0, GENESIS)


def _check_meta(conn: sqlite3.Connection, path: Path) -> None:
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    if not meta:
        conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                         [("format", FORMAT), ("store_version", str(STORE_VERSION))])
    elif meta.get("format") != FORMAT:
        raise NotAnEventLog(f"{path}: not a flare-diag event log (no {FORMAT!r} marker)")
    elif not str(meta.get("store_version", "0")).isdigit():
        raise NotAnEventLog(f"{path}: not a flare-diag event log (store_version {meta.get('store_version')!r})")
    elif int(meta.get("store_version", "0")) > STORE_VERSION:
        raise NotAnEventLog(f"{path}: event log store_version {meta['store_version']} is newer than this build's {STORE_VERSION}")


def _write_transaction(conn: sqlite3.Connection, chained: _Chained) -> None:
    """Commits the batch: on the database thread."""
    # One statement for the whole batch: SQLite unpacks it in C with the GIL released, so the
    # database thread does not contend with the event loop row by row as executemany would.
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(BULK_INSERT, chained.bulk())
    conn.execute("COMMIT")


def _write_slot(checkpoint: tuple[CheckpointSlots, int, bytes, bytes | None]) -> str | None:
    """Replaces the checkpoint; returns why it could not be written, or None. A checkpoint only lags the
    log, so failing to write one must not fail a commit that is already durable."""
    slots, seq, head, key = checkpoint
    try:
        slots.write(seq, head, key)
    except Exception as exc:  # EMFILE, ENOSPC, a folder in its place: the commit stands, the checkpoint lags
        return f"{slots.path}: {getattr(exc, 'strerror', None) or exc}"
    return None


def _slot_call(_conn: sqlite3.Connection, checkpoint: tuple[CheckpointSlots, int, bytes, bytes | None]) -> str | None:
    return _write_slot(checkpoint)


def _wal_checkpoint(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    except sqlite3.Error:
        pass  # the WAL only grows until the next one (or SQLite's own, at its bound)


def _fetch(conn: sqlite3.Connection, sql: str, args: list[Any]) -> list[Any]:
    return conn.execute(sql, args).fetchall()


def select_sql(from_seq: int, window_id: str | None, types: Iterable[str] | None) -> tuple[str, list[Any]]:
    where, args = ["seq >= ?"], list[Any]([from_seq])
    if window_id is not None:
        where.append("window_id = ?")
        args.append(window_id)
    if types is not None:
        ts = list(types)
        where.append(f"type IN ({','.join('?' * len(ts))})")
        args.extend(ts)
    return f"SELECT {COLUMNS} FROM events WHERE {' AND '.join(where)} ORDER BY seq", args


def row_envelope(r: Sequence[Any]) -> Envelope:
    try:
        return Envelope(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bytes(r[7]), bytes(r[8]), bytes(r[9]))
    except TypeError:  # a NULL or a number where bytes belong: not a row this store wrote
        from flare_diag.events.base import BadEventError
        raise BadEventError(f"seq {r[0]}: a column holds a value of the wrong type (row damaged or forged)") from None


class LogBusy(RuntimeError):
    """Another process holds the log's writer lock."""


def _lock_path(db: Path) -> Path:
    return Path(f"{os.fspath(db)}.lock")


def _take_writer_lock(db: Path) -> int | None:
    """The fd holding LOG.lock exclusively, or None when another process holds it. An advisory
    flock: released by the kernel when its holder exits, however it exits."""
    fd = os.open(_lock_path(db), os.O_RDWR | os.O_CREAT, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # closing the only descriptor drops the flock


@contextlib.contextmanager
def writer_lock(db: Path) -> Iterator[bool]:
    """Holds the log's writer lock for a synchronous tool; yields False when another process has it."""
    fd = _take_writer_lock(db)
    try:
        yield fd is not None
    finally:
        _release(fd)


def split_ddl(ddl: str) -> list[str]:
    """Splits the DDL into statements, keeping trigger bodies whole."""
    out, cur = [], []
    for line in ddl.strip().splitlines():
        cur.append(line)
        s = line.strip()
        if s.endswith("END;") or (s.endswith(";") and not any(c.lstrip().startswith("CREATE TRIGGER") for c in cur)):
            out.append("\n".join(cur))
            cur = []
    return out
