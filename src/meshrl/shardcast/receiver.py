"""`ShardReceiver`: one shard as it arrives, verified piece by piece (see `manifest.py`).

Each full piece is hashed and, only if it matches the manifest, written by the sink. A receiver
holds one piece (or a few, when pieces are verified in worker threads), never a whole shard: the
bytes are hashed and written while still in the CPU cache, and no shard-sized buffer is ever
faulted in. Transports (`transport.py`) fill it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable

from meshrl.shardcast.errors import OutputWriteError

__all__ = ["PieceMismatchError", "ShardReceiver", "Sink", "TransferError"]


class TransferError(Exception):
    """A shard transfer that failed (HTTP status, short body, bad Content-Range...)."""

    def __init__(self, msg: str, status: int | None = None, retry_after: float = 0.0) -> None:
        super().__init__(msg)
        self.status, self.retry_after = status, retry_after


class PieceMismatchError(TransferError):
    """A piece whose sha256 is not the manifest's; `sources` sent bytes of it."""

    def __init__(self, pos: int, sources: set[str]) -> None:
        super().__init__(f"piece at byte {pos} does not match its sha256")
        self.pos, self.sources = pos, sources


Sink = Callable[[int, memoryview], None]  # (byte position in the shard, verified bytes)


class ShardReceiver:
    """One shard as it arrives: `filled` bytes received so far, written only once verified.

    The transport asks `get_buffer()` where the next bytes go and reports them with
    `received(n)`; a full piece is verified and passed to `sink(pos, data)`. With `depth` 0 this
    happens at once on the event loop (about 1 ms per MiB; the cheapest on few cores, where
    handing every piece to another thread costs more CPU than the hash). With `depth` > 0 it
    happens in worker threads while the next pieces arrive (for many cores and fast links), and
    `received` returns False while `depth` pieces are in flight: the transport should stop
    reading until `on_space` is called. A bad piece or a failed write aborts the transfer
    (`on_abort`); `settle()` waits for the pieces in flight and raises `PieceMismatchError`
    (after rewinding `filled` to the bad piece) or `OutputWriteError`.
    """

    def __init__(self, size: int, piece_size: int, digests: list[str], sink: Sink,
                 depth: int = 0) -> None:
        if len(digests) != -(-size // piece_size):
            raise ValueError("one digest per piece is needed")
        self.size, self.piece_size, self.digests, self.sink = size, piece_size, digests, sink
        self.depth = depth
        self.filled = 0
        self.source = ""  # the server currently sending (blamed for a bad piece)
        self.on_space: Callable[[], None] | None = None
        self.on_abort: Callable[[Exception], None] | None = None
        self._free: list[bytearray] = []
        self._cur = bytearray(min(piece_size, size))
        self._cur_sources: set[str] = set()
        self._pending: set[asyncio.Future[bool]] = set()
        self._done: set[int] = set()
        self._bad: PieceMismatchError | None = None
        self._write_error: BaseException | None = None

    @property
    def complete(self) -> bool:
        return len(self._done) == len(self.digests)

    def _piece_len(self, pos: int) -> int:
        return min(self.piece_size, self.size - pos)

    def _cur_start(self) -> int:
        return self.filled - self.filled % self.piece_size

    def get_buffer(self) -> memoryview:
        start = self._cur_start()
        return memoryview(self._cur)[self.filled - start : self._piece_len(start)]

    def feed(self, data: bytes | memoryview) -> bool:
        """Copy `data` in (for transports that hand out their own chunks)."""
        data, ok = memoryview(data), True
        while data:
            if self.filled >= self.size:
                raise TransferError("body longer than the shard")
            view = self.get_buffer()
            n = min(len(view), len(data))
            view[:n] = data[:n]
            data = data[n:]
            ok = self.received(n)
        return ok

    def received(self, n: int) -> bool:
        start = self._cur_start()
        self.filled += n
        if self.source:
            self._cur_sources.add(self.source)
        if self.filled - start == self._piece_len(start) and self.filled > start:
            self._submit(start)
        return self.depth == 0 or len(self._pending) < self.depth

    def restart(self) -> None:
        """The server sends the shard from byte 0 (it ignored our Range)."""
        self.filled = 0
        self._cur_sources = set()

    def _submit(self, start: int) -> None:
        buf, sources = self._cur, self._cur_sources
        self._cur_sources = set()
        j, length = start // self.piece_size, self._piece_len(start)
        if self.depth == 0:  # inline: the piece is still in this core's cache
            try:
                ok = self._verify_write(buf, start, length, self.digests[j])
            except Exception as e:  # a failed write: settle() reports it
                return self._finish(j, start, sources, False, e)
            return self._finish(j, start, sources, ok, None)
        self._cur = self._free.pop() if self._free else bytearray(len(buf))
        fut = asyncio.get_running_loop().run_in_executor(
            None, self._verify_write, buf, start, length, self.digests[j])
        self._pending.add(fut)

        def done(f: asyncio.Future[bool]) -> None:
            self._pending.discard(f)
            self._free.append(buf)
            exc = f.exception()
            self._finish(j, start, sources, exc is None and f.result(), exc)
            if len(self._pending) < self.depth and self.on_space is not None:
                self.on_space()

        fut.add_done_callback(done)

    def _verify_write(self, buf: bytearray, start: int, length: int, digest: str) -> bool:
        data = memoryview(buf)[:length]
        if hashlib.sha256(data).hexdigest() != digest:
            return False
        self.sink(start, data)
        return True

    def _finish(self, j: int, start: int, sources: set[str], ok: bool,
                exc: BaseException | None) -> None:
        if exc is not None:
            self._write_error = self._write_error or exc
            self._abort(OutputWriteError(f"shardcast: cannot write: {exc}"))
        elif ok:
            self._done.add(j)
        else:
            if self._bad is None or start < self._bad.pos:
                self._bad = PieceMismatchError(start, sources)
            self._abort(self._bad)

    def _abort(self, exc: Exception) -> None:
        if self.on_abort is not None:
            self.on_abort(exc)

    async def settle(self) -> None:
        """Wait for the pieces being verified; raise what went wrong with them."""
        while self._pending:
            await asyncio.wait(set(self._pending))
        if self._write_error is not None:
            raise OutputWriteError(f"shardcast: cannot write: {self._write_error}")
        if self._bad is not None:
            bad, self._bad = self._bad, None
            self.filled = min(self.filled, bad.pos)  # every byte before it is verified
            self._cur_sources = set()
            raise bad
