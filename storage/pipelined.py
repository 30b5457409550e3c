"""One Redis connection pipelining one Lua script: calls go out as they come, replies come back in order (RESP).

The service's per-request read (storage/cache_async.py) is one script call. redis-py's asyncio client spends some
30 us of CPU on a command in generic machinery (a pool checkout, a retry wrapper, observability hooks, a timer
per socket read, a task per timed send); here a call is a packed command written to a connection every request
of the worker shares (the calls of one turn of the event loop in one write) and a future resolved when hiredis
parses its reply: about 10 us (benchmarks/ranker_stages.py). Plain ``redis://`` only (host, port, db, user and
password read from the URL by redis-py's own parser); TLS and every other command stay with redis-py.

Failures: a connection that cannot be opened or breaks fails every call waiting on it (ConnectionError); the next
call opens another. A call sent on a connection opened before it, which then breaks, is sent once more on a fresh
one (a Redis restarted since). A call past its deadline raises TimeoutError and closes the connection: a Redis that
hangs answers nobody on it. A script the server lost (restarted, SCRIPT FLUSH) is sent once in full.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Mapping
from typing import Any

import hiredis
from redis.asyncio.connection import parse_url
from redis.exceptions import ResponseError


class _Replies(asyncio.Protocol):
    """A connection's protocol: one future per command sent, resolved by the replies in the order sent.

    The commands of one turn of the event loop go out in one write at its end: under load a turn starts several
    requests, and one system call (and one wake-up of Redis, which then answers them in one write too) costs less
    than one each.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.parser = loop, hiredis.Reader()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.unsent: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.broken: ConnectionError | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream connection's transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed(data)
        try:
            while (reply := self.parser.gets()) is not False:
                waiter = self.waiting.popleft()
                if not waiter.done():  # a caller past its deadline is gone
                    waiter.set_result(reply)
        except (hiredis.ProtocolError, IndexError) as exc:  # not RESP, or a reply to nothing sent
            self.close(ConnectionError(f"Redis protocol error: {exc or type(exc).__name__}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(ConnectionError(f"connection to Redis lost: {exc or 'closed by the server'}"))

    def fail(self, error: ConnectionError) -> None:
        """Mark the connection broken and fail every call still waiting on it."""
        self.broken = self.broken or error
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_exception(error)

    def close(self, error: ConnectionError) -> None:
        """Fail the calls waiting and close the connection."""
        self.fail(error)
        self.unsent.clear()
        if self.transport is not None:
            self.transport.close()

    def send(self, command: bytes) -> asyncio.Future[Any]:
        """Return the future of the reply to a packed command, written at the end of this turn of the loop."""
        waiter = self.loop.create_future()
        if self.broken is not None or self.transport is None:
            waiter.set_exception(self.broken or ConnectionError("not connected to Redis"))
            return waiter
        self.waiting.append(waiter)
        if not self.unsent:
            self.loop.call_soon(self.flush)
        self.unsent.append(command)
        return waiter

    def flush(self) -> None:
        """Write the commands sent in this turn, in one write."""
        if self.unsent and self.broken is None and self.transport is not None:
            self.transport.write(b"".join(self.unsent))
        self.unsent.clear()


class PipelinedScript:
    """Calls one Lua script over one pipelined connection to a plain redis:// server, opened on first use."""

    def __init__(self, url: str, script: str, connect_timeout_s: float) -> None:
        options = parse_url(url)
        if "connection_class" in options or not url.startswith("redis://"):
            raise ValueError("a pipelined script needs a plain redis:// URL (TLS and sockets stay with redis-py)")
        self._host, self._port = str(options.get("host") or "localhost"), int(options.get("port") or 6379)
        self._handshake = handshake(options)
        self._script = script.encode()
        self._sha = hashlib.sha1(self._script).hexdigest().encode()  # Redis names scripts by SHA-1
        self._connect_timeout_s = connect_timeout_s
        self._protocol: _Replies | None = None
        self._opening: asyncio.Task[_Replies] | None = None

    async def call(self, keys: list[str], args: list[Any], timeout_s: float) -> Any:
        """Return the script's reply (bytes, None, lists of them) within timeout_s, the connection's opening included.

        Raises:
            ConnectionError: Redis cannot be reached, or the connection broke (twice, for one opened before the call).
            TimeoutError: no reply within timeout_s (the connection is closed).
            ResponseError: the script failed in Redis.
        """
        used = self._protocol
        try:
            async with asyncio.timeout(timeout_s):
                if used is None or used.broken is not None:
                    used = None
                    used = await self._open()
                    return await self._call_on(used, keys, args)
                try:
                    return await self._call_on(used, keys, args)
                except ConnectionError:  # opened before this call: perhaps to a Redis restarted since
                    used = None
                    used = await self._open()
                    return await self._call_on(used, keys, args)
        except TimeoutError:
            if used is not None:  # (an opening has a deadline of its own)
                self._drop(used, f"no reply within {timeout_s:g} s")
            raise

    async def close(self) -> None:
        """Close the connection (calls waiting on it fail)."""
        if self._protocol is not None:
            self._drop(self._protocol, "closed")
        if self._opening is not None:
            self._opening.cancel()

    async def _call_on(self, protocol: _Replies, keys: list[str], args: list[Any]) -> Any:
        """Return the reply of one script call on a connection (the script sent in full when the server lost it)."""
        reply = await protocol.send(_pack(b"EVALSHA", self._sha, len(keys), *keys, *args))
        if isinstance(reply, hiredis.ReplyError) and str(reply).startswith("NOSCRIPT"):
            reply = await protocol.send(_pack(b"EVAL", self._script, len(keys), *keys, *args))
        if isinstance(reply, hiredis.ReplyError):
            raise ResponseError(str(reply))
        return reply

    async def _open(self) -> _Replies:
        """Return a new open connection, one for every caller waiting (a caller's deadline stops only its own wait)."""
        if self._opening is None:
            self._opening = asyncio.get_running_loop().create_task(self._connect())
            self._opening.add_done_callback(self._opened)
        return await asyncio.shield(self._opening)

    def _opened(self, opening: asyncio.Task[_Replies]) -> None:
        """Keep the connection just opened (none when opening failed: the next call tries again)."""
        self._opening = None
        if not opening.cancelled() and opening.exception() is None:
            self._protocol = opening.result()

    async def _connect(self) -> _Replies:
        """Return a connection that logged in and selected its database.

        Raises:
            ConnectionError: Redis refused the connection, the login or the database.
        """
        loop, protocol = asyncio.get_running_loop(), None
        try:
            async with asyncio.timeout(self._connect_timeout_s):  # a server that accepts and never answers
                _, protocol = await loop.create_connection(lambda: _Replies(loop), self._host, self._port)
                for command in self._handshake:
                    reply = await protocol.send(command)
                    if isinstance(reply, hiredis.ReplyError):
                        raise ConnectionError(f"Redis refused the connection's set-up: {reply}")
        except BaseException:
            if protocol is not None:
                protocol.close(ConnectionError("connection set-up failed"))
            raise
        return protocol

    def _drop(self, protocol: _Replies, why: str) -> None:
        """Close a connection; when it is the current one, the next call opens another."""
        protocol.close(ConnectionError(f"connection to Redis dropped: {why}"))
        if self._protocol is protocol:
            self._protocol = None


def handshake(options: Mapping[str, Any]) -> list[bytes]:
    """Return the packed commands a new connection sends first: AUTH when the URL has a password, SELECT its db."""
    commands = []
    if options.get("password") is not None:
        user = options.get("username")
        commands.append(_pack("AUTH", user, options["password"]) if user else _pack("AUTH", options["password"]))
    if int(options.get("db") or 0):
        commands.append(_pack("SELECT", int(options["db"])))
    return commands


def _pack(*parts: Any) -> bytes:
    """Return a command in RESP (hiredis' packer, in C)."""
    return hiredis.pack_command(parts)
