"""``vit-fast serve``'s HTTP front: it listens on the user's HTTP port, in a process of its own, and passes each request
on to Triton's HTTP port on loopback, but for an inference request whose declared shapes exceed the served model's
limits or do not match the data it carries (:mod:`vit_fast.serve.declared`), which gets a 400 and a one-line message
before Triton reads it; a body larger than the largest valid request is refused from its length. Stdlib only.
Why and what it does not cover: docs/deploy.md, "The HTTP front"."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import socket
import sys
import zlib
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from vit_fast.serve.declared import RequestLimits, request_problem
from vit_fast.serve.refusals import RefusalLog

#: the longest request or response head read (request line and headers)
HEAD_MAX = 64 * 2**10
#: seconds a kept-alive connection may wait for its next request, and any one read within a request may take
IDLE_S, READ_S = 300.0, 60.0
#: bytes copied per step from a client to Triton
CHUNK = 2**20
#: after a refusal whose body was not read: at most this long and this many bytes read and dropped before closing,
#: so the client reads the answer instead of a connection reset
LINGER_S, LINGER_BYTES = 2.0, 64 * 2**20
REASONS = {400: "Bad Request", 413: "Payload Too Large", 431: "Request Header Fields Too Large"}
REASONS |= {501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
_INFER = re.compile(r"/infer/*$", re.IGNORECASE)
#: request headers the front writes itself (the body is framed anew) or answers itself (100-continue)
_REFRAMED = {"content-length", "transfer-encoding", "expect"}


class Refused(Exception):
    """A request answered by the front: ``status``, ``message``; ``readable``: its body was read (or it has none), so
    the connection can carry the next request."""

    def __init__(self, status: int, message: str, readable: bool = True) -> None:
        super().__init__(message)
        self.status, self.message, self.readable = status, message, readable


@dataclass
class Head:
    """A request's first line and headers, as parsed (names as sent, values stripped)."""

    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def values(self, name: str) -> list[str]:
        return [v for n, v in self.headers if n.lower() == name]

    def tokens(self, name: str) -> list[str]:
        return [t.strip().lower() for v in self.values(name) for t in v.split(",") if t.strip()]


def parse_head(raw: bytes) -> Head:
    """A request head (ending in a blank line) -> :class:`Head`; :class:`Refused` for anything but strict HTTP/1.x:
    every line CRLF-ended, no bare CR, LF or NUL, no folded lines, header names tokens. Strict, because Triton must
    see the very request the front judged."""
    lines = raw[:-4].split(b"\r\n")
    if any(b"\r" in line or b"\n" in line or b"\0" in line for line in lines):
        raise Refused(400, "a bare CR, LF or NUL in the request head", readable=False)
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1]:
        raise Refused(400, "a malformed request line", readable=False)
    if parts[2] not in (b"HTTP/1.0", b"HTTP/1.1"):
        raise Refused(505, "HTTP/1.0 and HTTP/1.1 only", readable=False)
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise Refused(400, "a malformed header line", readable=False)
        headers.append((name.decode("latin-1"), value.strip(b" \t").decode("latin-1")))
    return Head(*(p.decode("latin-1") for p in parts), headers)


def is_inference(method: str, target: str) -> bool:
    """Whether Triton may take a ``method`` request for ``target`` as an inference: a POST to any path ending in
    ``/infer`` (also percent-encoded, in any case), a superset of its route ``/v2/models/NAME[/versions/N]/infer``."""
    path = urlsplit(target).path if "://" in target else target.split("?", 1)[0].split("#", 1)[0]
    return method == "POST" and any(_INFER.search(p) for p in (path, unquote(path)))


def body_length(head: Head) -> int | None:
    """The body's length from Content-Length (None: chunked); :class:`Refused` for framings Triton might read
    differently (both headers, several lengths, an encoding other than chunked)."""
    if head.values("transfer-encoding"):
        if head.values("content-length"):
            raise Refused(400, "both Transfer-Encoding and Content-Length", readable=False)
        if head.tokens("transfer-encoding") != ["chunked"]:
            raise Refused(501, "a Transfer-Encoding other than chunked", readable=False)
        return None
    lengths = {t for v in head.values("content-length") for t in v.split(",")}
    if not lengths:
        return 0
    text = lengths.pop().strip()
    if lengths or not text.isdigit() or not text.isascii() or len(text) > 15:
        raise Refused(400, "a malformed Content-Length", readable=False)
    return int(text)


def inflate(body: bytes, encoding: str, cap: int) -> bytes:
    """A gzip or deflate body, decompressed to at most ``cap`` bytes (Triton 2.51 would inflate any size)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, cap + 1)
    except zlib.error:
        raise Refused(400, f"the body does not decompress as {encoding}") from None
    if len(out) > cap or inflater.unconsumed_tail:
        raise Refused(413, f"the body decompresses to over {cap} bytes, more than the largest valid request")
    if not inflater.eof:
        raise Refused(400, f"the body is a truncated {encoding} stream")
    return out


async def _read(reader: asyncio.StreamReader, size: int) -> bytes:
    try:
        return await asyncio.wait_for(reader.readexactly(size), READ_S)
    except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
        raise Refused(400, "the body ended early or stalled", readable=False) from None


async def read_chunked(reader: asyncio.StreamReader, cap: int) -> bytes:
    """A chunked body, at most ``cap`` bytes (:class:`Refused` beyond, unread)."""
    body = bytearray()
    while True:
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\r\n"), READ_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            raise Refused(400, "a malformed chunked body", readable=False) from None
        size_text = line[:-2].split(b";", 1)[0].strip()
        if not _HEX.fullmatch(size_text):
            raise Refused(400, "a malformed chunk size", readable=False)
        size = int(size_text, 16)
        if len(body) + size > cap:
            raise Refused(413, f"a chunked body over {cap} bytes, the largest valid request", readable=False)
        if size == 0:
            while (await _read_line(reader)) != b"\r\n":  # trailers, dropped
                pass
            return bytes(body)
        chunk = await _read(reader, size + 2)
        if chunk[-2:] != b"\r\n":
            raise Refused(400, "a malformed chunked body", readable=False)
        body += chunk[:-2]


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    try:
        return await asyncio.wait_for(reader.readuntil(b"\r\n"), READ_S)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
        raise Refused(400, "a malformed chunked body", readable=False) from None


class _UpstreamGone(Exception):
    """Triton closed the connection, or answered with something that is not HTTP."""


class _ClientGone(Exception):
    """The client closed its connection in the middle of its body."""


class Front:
    """The front of one served model: :meth:`serve` runs one client connection, passing each request to Triton at
    ``upstream`` (host, port) on a connection of its own, kept alive, unless ``limits`` refuse it."""

    def __init__(self, limits: RequestLimits, upstream: tuple[str, int], log: RefusalLog) -> None:
        self.limits, self.upstream, self.log = limits, upstream, log
        self.refused = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up: list = []  # [reader, writer] of this connection's Triton connection, once opened
        try:
            while True:
                try:
                    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_S)
                except asyncio.LimitOverrunError:
                    await self.refuse(reader, writer, Refused(431, "a request head over 64 KiB", readable=False))
                    return
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    return
                try:
                    head = parse_head(raw)
                    keep = await self.forward(head, reader, writer, up)
                except Refused as refusal:
                    keep = await self.refuse(reader, writer, refusal)
                except _UpstreamGone:
                    await self.refuse(reader, writer, Refused(502, "Triton closed the connection", readable=False))
                    return
                if not keep:
                    return
        except ConnectionError:
            return
        finally:
            for w in (writer, *up[1:]):
                w.close()

    async def refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, refusal: Refused) -> bool:
        """Answer ``refusal`` (JSON ``{"error": message}``, as Triton's errors); True when the connection goes on."""
        self.refused += 1
        self.log.note(f"{refusal.message} (HTTP {refusal.status}, by the front, before Triton)")
        body = json.dumps({"error": refusal.message}).encode()
        close = "" if refusal.readable else "Connection: close\r\n"
        writer.write(
            f"HTTP/1.1 {refusal.status} {REASONS.get(refusal.status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{close}\r\n".encode()
            + body
        )
        await writer.drain()
        if refusal.readable:
            return True
        if writer.can_write_eof():  # what the client still sends is read and dropped, briefly, then the close
            writer.write_eof()
        dropped = 0
        try:
            while dropped < LINGER_BYTES and (data := await asyncio.wait_for(reader.read(CHUNK), LINGER_S)):
                dropped += len(data)
        except (TimeoutError, ConnectionError):
            pass
        return False

    async def forward(self, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: list) -> bool:
        """Check ``head``'s request, pass it on and relay Triton's answer; True when the connection goes on."""
        inference, limits = is_inference(head.method, head.target), self.limits
        cap = limits.max_body if inference else limits.max_json
        length = body_length(head)
        if length is not None and length > cap:
            raise Refused(
                413, f"a body of {length} bytes, over the {cap} of the largest valid request to this server", False
            )
        encoding = ",".join(head.tokens("content-encoding"))
        if inference and encoding not in ("", "identity", "gzip", "deflate"):
            raise Refused(400, f"Content-Encoding {encoding!r}: send identity, gzip or deflate", readable=False)
        if up and up[0].at_eof():  # Triton closed this kept-alive connection (it stopped, or restarted)
            up[1].close()
            up.clear()
        if not up:
            try:
                up.extend(await asyncio.open_connection(*self.upstream, limit=HEAD_MAX))
            except OSError:
                raise Refused(503, "Triton is not answering (restarting?): retry", readable=length == 0) from None
        if "100-continue" in head.tokens("expect") and length != 0:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        drop = set(_REFRAMED)
        rest = 0  # bytes of the body streamed after the checked part
        if length is None or encoding in ("gzip", "deflate"):  # read whole, decompressed: Triton gets it plain
            body = await read_chunked(reader, cap) if length is None else await _read(reader, length)
            if encoding in ("gzip", "deflate"):
                body, drop = inflate(body, encoding, cap), drop | {"content-encoding"}
            if inference:
                split = self.json_part(head, len(body), readable=True)
                self.check_json(body[:split], len(body) - split, readable=True)
        elif inference:
            split = self.json_part(head, length, readable=False)
            body = await _read(reader, split)
            rest = length - split
            self.check_json(body, rest, readable=not rest)
        else:
            body = await _read(reader, length)
        lines = [f"{head.method} {head.target} {head.version}"]
        lines += [f"{n}: {v}" for n, v in head.headers if n.lower() not in drop]
        lines.append(f"Content-Length: {len(body) + rest}")
        up_reader, up_writer = up
        try:
            up_writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            await up_writer.drain()
            while rest:
                data = await asyncio.wait_for(reader.read(min(CHUNK, rest)), READ_S)
                if not data:
                    raise _ClientGone
                up_writer.write(data)
                await up_writer.drain()
                rest -= len(data)
            keep = await relay(head.method, up_reader, writer)
        except _ClientGone:
            up_writer.close()
            up.clear()
            return False
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as err:
            up_writer.close()
            up.clear()
            raise _UpstreamGone from err
        if not keep:
            up_writer.close()
            up.clear()
        closing = "close" in head.tokens("connection")
        return keep and not closing and (head.version == "HTTP/1.1" or "keep-alive" in head.tokens("connection"))

    def json_part(self, head: Head, length: int, readable: bool) -> int:
        """Where the JSON part of an inference request of ``length`` bytes ends: Inference-Header-Content-Length,
        else the whole body (:class:`Refused` beyond what this server reads as JSON)."""
        values = head.values("inference-header-content-length")
        split = length
        if values:
            text = values[0].strip()
            if len(values) > 1 or not text.isdigit() or not text.isascii() or int(text) > length:
                raise Refused(400, f"Inference-Header-Content-Length must be 0 to {length}, got {values}", readable)
            split = int(text)
        if split > self.limits.max_json:
            raise Refused(
                413,
                f"a JSON part of {split} bytes, over the {self.limits.max_json} this server reads: send the tensor as "
                "binary data (binary_data_size)",
                readable,
            )
        return split

    def check_json(self, header: bytes, binary: int, readable: bool) -> None:
        problem = request_problem(header, binary, self.limits)
        if problem is not None:
            raise Refused(400, problem, readable)


async def relay(method: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Copy one response from Triton (``reader``) to the client; True when Triton's connection can be used again."""
    try:
        while True:
            raw = await reader.readuntil(b"\r\n\r\n")
            writer.write(raw)
            status = int(raw.split(b" ", 2)[1])
            if status >= 200:
                break
        head = parse_head(b"GET / HTTP/1.1\r\n" + raw.split(b"\r\n", 1)[1])  # the headers, parsed as a request's
    except (Refused, ValueError, IndexError) as err:
        raise _UpstreamGone from err
    keep = "close" not in head.tokens("connection") and raw.startswith(b"HTTP/1.1")
    if method == "HEAD" or status in (204, 304):
        pass
    elif head.tokens("transfer-encoding")[-1:] == ["chunked"]:
        while True:
            line = await reader.readuntil(b"\r\n")
            writer.write(line)
            size = int(line[:-2].split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                    writer.write(line)
                writer.write(line)
                break
            writer.write(await reader.readexactly(size + 2))
            await writer.drain()
    elif head.values("content-length"):
        left = int(head.values("content-length")[0])
        while left:
            data = await reader.read(min(CHUNK, left))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            writer.write(data)
            await writer.drain()
            left -= len(data)
    else:  # delimited by the close
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        keep = False
    await writer.drain()
    return keep


async def _run(sock: socket.socket, front: Front) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    server = await asyncio.start_server(front.serve, sock=sock, limit=HEAD_MAX)
    print("ready", flush=True)  # the parent waits for this line (FrontProcess.start)
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m vit_fast.serve.front --fd FD --upstream HOST:PORT --limits JSON``: serve the listening socket FD
    until SIGTERM. Ctrl-C is ignored: the server stops its front itself, after Triton has drained."""
    parser = argparse.ArgumentParser(prog="python -m vit_fast.serve.front")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--limits", required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    host, _, port = args.upstream.rpartition(":")
    front = Front(RequestLimits.from_json(args.limits), (host, int(port)), RefusalLog())
    asyncio.run(_run(socket.socket(fileno=args.fd), front))
    if front.refused:
        print(f"[vit-fast serve] the HTTP front refused {front.refused} request(s)", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
