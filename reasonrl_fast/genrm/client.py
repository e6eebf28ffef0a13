"""A client for GenRM servers (OpenAI-compatible chat endpoints) that a synchronous trainer
driver can call while it waits for other work, and that never stalls or crashes a step.

One background thread runs an asyncio loop with one reused HTTP session. `submit` returns a
`concurrent.futures.Future` at once; its result is always a `Verdict` (fail-open: a server
problem gives `step=None`, which the caller treats as "no penalty"). Requests go to the replica
with the fewest outstanding requests; a replica that keeps failing rests for a while; each
attempt has a time limit that really ends it, and retries are bounded with jittered backoff.
A reply is read up to a size cap and parsed defensively: one broken replica costs its requests
their verdicts, never the driver's memory or its thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import random
import re
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp

from reasonrl_fast.protocol import API_KEY_ENV, TEMPLATES, is_flawed, normalize_address, parse_verdict, render
from reasonrl_fast.redact import hide, redact_url, secrets_of
from reasonrl_fast.util import quantile

log = logging.getLogger(__name__)

MAX_REPLY_BYTES = 4 << 20
"""Default cap on one reply's body: a verdict is a few kilobytes; a reply over this is a fault."""

TRUNCATED = "truncated"
"""The error of an answer without a usable verdict that the server cut at `max_tokens`
(`finish_reason` "length"): a GenRM that needed more room, not one that answered badly."""


@dataclass(frozen=True)
class Verdict:
    """The GenRM's answer on one response. `step`: the verdict as the template's rule reads it
    (protocol.parse_verdict: the earliest wrong step, -1 when none; under "published" any
    integer), None when there is no usable verdict (the caller then applies no penalty), with
    `error` saying why ("timeout", "http 500", "unparseable", "truncated", "refused: 401", ...).
    `flawed`: the verdict flags the response (protocol.is_flawed)."""

    step: int | None
    flawed: bool = field(init=False)
    error: str = ""
    attempts: int = 0
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "flawed", is_flawed(self.step))

    @property
    def truncated(self) -> bool:
        """No verdict because the answer reached `max_tokens` first."""
        return self.error == TRUNCATED


class _Retryable(Exception):
    """An attempt failed in a way another attempt (or replica) may not: the reason is the text."""


class _Final(Exception):
    """An attempt failed in a way that retrying cannot fix (a 4xx other than 429)."""


@dataclass
class _Replica:
    index: int
    base: str  # what requests go to: credentials in it are sent (HTTP basic auth)
    shown: str  # what messages say: `base` with them redacted (redact_url)
    outstanding: int = 0
    fails: int = 0  # consecutive failed attempts
    down_until: float = 0.0  # loop.time() before which it is skipped
    warned: bool = False


class GenRMClient:
    """Ask one or more GenRM replicas for verdicts; see the module docstring and docs/genrm_client.md."""

    def __init__(self, addresses: list[str], *, model: str = "", api_key: str = "",
                 template: str = "fapo", timeout_s: float = 30.0, max_retries: int = 3,
                 max_tokens: int = 1024, temperature: float = 0.0, top_p: float = 1.0, max_concurrency: int = 64,
                 fail_threshold: int = 3, cooldown_s: float = 10.0, backoff_base_s: float = 0.2,
                 backoff_max_s: float = 5.0, max_reply_bytes: int = MAX_REPLY_BYTES):
        if isinstance(addresses, str):
            addresses = [addresses]
        if not addresses:
            raise ValueError("GenRMClient: addresses is empty (give at least one 'host:port')")
        for name, value, ok in [("timeout_s", timeout_s, timeout_s > 0),
                                ("max_retries", max_retries, max_retries >= 0),
                                ("max_tokens", max_tokens, max_tokens >= 1),
                                ("top_p", top_p, 0 < top_p <= 1),
                                ("max_concurrency", max_concurrency, max_concurrency >= 1),
                                ("fail_threshold", fail_threshold, fail_threshold >= 1),
                                ("cooldown_s", cooldown_s, cooldown_s >= 0),
                                ("backoff_base_s", backoff_base_s, backoff_base_s >= 0),
                                ("backoff_max_s", backoff_max_s, backoff_max_s >= 0),
                                ("max_reply_bytes", max_reply_bytes, max_reply_bytes >= 1)]:
            if not ok:
                raise ValueError(f"GenRMClient: {name}={value!r} is out of range")
        if template not in TEMPLATES:
            raise ValueError(f"GenRMClient: template={template!r} is unknown: expected one of {TEMPLATES}")
        self._key = api_key or os.environ.get(API_KEY_ENV, "")
        # What no message of ours may hold: the key, and the credentials of any address. Messages
        # name an address by redact_url; texts from elsewhere (a library's exception, a server's
        # error body) go through self._redact on their way to an error or a log line.
        self._secrets = secrets_of(addresses, self._key)
        self._replicas = []
        for i, a in enumerate(addresses):
            try:
                base = normalize_address(a)
            except ValueError as e:
                raise ValueError(self._redact(str(e).replace(str(a), redact_url(str(a))))) from None
            if base != redact_url(base) and self._key:
                # aiohttp refuses a request with both (a ValueError each time): say so once, here
                raise ValueError(f"GenRMClient: address {redact_url(base)!r} carries credentials (user:password@) "
                                 f"and an API key is set (api_key or {API_KEY_ENV}): both would be the "
                                 "Authorization header; give one of them")
            self._replicas.append(_Replica(i, base, redact_url(base)))
        self._model = model
        self._template, self._max_tokens, self._temperature = template, max_tokens, temperature
        self._top_p = float(top_p)
        self._timeout_s, self._max_retries = float(timeout_s), max_retries
        self._fail_threshold, self._cooldown_s = fail_threshold, cooldown_s
        self._backoff_base_s, self._backoff_max_s = backoff_base_s, backoff_max_s
        self._max_concurrency = max_concurrency
        self._max_reply_bytes = int(max_reply_bytes)
        self._max_values = max(self._max_reply_bytes // VALUE_BYTES, MIN_VALUES)
        self._rr = 0  # round-robin pointer among replicas tied on outstanding requests
        self._model_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._lock = threading.Lock()  # guards the counters (written on the loop, read by metrics())
        self._reset_counters()
        self._closed = False
        self._submit_lock = threading.Lock()  # no submit slips in between close()'s check and its stop
        self._pending: set[concurrent.futures.Future] = set()
        self._rng = random.Random()  # jitter; the global generator is the trainer's to seed
        self._loop = asyncio.new_event_loop()
        self._start_error: BaseException | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="genrm-client", daemon=True)
        self._thread.start()
        if not ready.wait(10.0):
            raise RuntimeError("GenRMClient: the event loop thread did not start within 10 s")
        if self._start_error is not None:
            why = self._redact(repr(self._start_error))
            raise RuntimeError(f"GenRMClient: could not start: {why}") from self._start_error

    # ------------------------------------------------------------ the caller's side (any thread)

    def submit(self, problem: str, answer: str, steps: list[str],
               solution: str | None = None) -> concurrent.futures.Future:
        """Ask for one verdict; returns at once. The future's result is a Verdict, never an exception
        for a server problem. `solution`: the response as written, which the "published"
        template shows instead of the steps (and needs: a ValueError without it)."""
        if not isinstance(steps, (list, tuple)) or not all(isinstance(s, str) for s in steps):
            raise TypeError(f"GenRMClient.submit: steps must be a list of str, got {type(steps).__name__}")
        message = render(self._template, str(problem), str(answer), list(steps),
                         None if solution is None else str(solution))
        with self._submit_lock:
            if self._closed:
                raise RuntimeError("GenRMClient is closed: submit() after close()")
            with self._lock:
                self._requests += 1
            coro = self._judge(message, len(steps), time.perf_counter())
            fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        return fut

    def judge(self, requests: list[tuple]) -> list[Verdict]:
        """Submit every (problem, answer, steps[, solution]) and wait for all verdicts, in order."""
        futures = [self.submit(*r) for r in requests]
        return [f.result() for f in futures]

    def metrics(self) -> dict[str, float]:
        """Counters since the last call (then reset): genrm/requests, failures, unparseable, truncated,
        retries, latency_p50_s and latency_p99_s (submit to verdict, over the requests finished
        meanwhile). `failures` counts every request without a verdict; `unparseable` and
        `truncated` the answers among them that came but held none, cut at `max_tokens`
        (`truncated`) or not (`unparseable`)."""
        with self._lock:
            lat = list(self._latencies)
            out = {"genrm/requests": self._requests, "genrm/failures": self._failures,
                   "genrm/unparseable": self._unparseable, "genrm/truncated": self._truncated,
                   "genrm/retries": self._retries}
            self._reset_counters()
        out["genrm/latency_p50_s"] = quantile(lat, 0.50)
        out["genrm/latency_p99_s"] = quantile(lat, 0.99)
        return out

    def replica_status(self) -> list[dict[str, Any]]:
        """Each replica's address (without its credentials), outstanding requests, consecutive
        failures and remaining cool-down."""
        now = self._loop.time()
        return [{"address": r.shown, "outstanding": r.outstanding, "fails": r.fails,
                 "cooldown_left_s": max(0.0, r.down_until - now)} for r in self._replicas]

    def close(self, timeout_s: float = 5.0) -> None:
        """Cancel what is in flight (those futures get Verdict(step=None, error="closed")), close the
        session and stop the loop; returns within about `timeout_s`. Idempotent."""
        with self._submit_lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + timeout_s
        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout_s)
            except (concurrent.futures.TimeoutError, RuntimeError):
                log.warning("GenRMClient.close: the shutdown did not finish in %.1f s", timeout_s)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(max(0.1, deadline - time.monotonic()))
        for fut in self._pending.copy():  # only if the shutdown ran out of time: no caller waits forever
            if not fut.done():
                try:
                    fut.set_result(Verdict(None, error="closed"))
                except concurrent.futures.InvalidStateError:
                    pass

    def __enter__(self) -> GenRMClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ the loop's side

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._setup())
        except BaseException as e:  # reported by __init__ on the caller's thread
            self._start_error = e
        ready.set()
        try:
            if self._start_error is None:
                self._loop.run_forever()
        finally:
            self._loop.close()

    async def _setup(self) -> None:
        # The session and its connector bind to the running loop, so they are made on it.
        # TCPConnector limit = the semaphore's: one kept-alive connection per request in flight.
        self._sem = asyncio.Semaphore(self._max_concurrency)
        # auto_decompress=False: the client decodes gzip and deflate itself, with the reply cap on
        # the decoded bytes (_read_capped), whatever aiohttp's version (3.13.2 inflated all that had
        # come at once: a 300 KB gzip reply took 250 MB). Accept-Encoding names only those two,
        # which aiohttp would widen to br and zstd when their packages are installed.
        headers = {"Accept-Encoding": "gzip, deflate"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        # read_bufsize: aiohttp stops reading a socket once twice this much of its body waits
        # unread, so a reply far over the cap costs that much before _read_capped refuses it.
        # Said here rather than left to aiohttp's default, which a version could raise.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._max_concurrency),
            timeout=aiohttp.ClientTimeout(total=self._timeout_s), headers=headers, auto_decompress=False,
            read_bufsize=_PIECE)

    async def _shutdown(self) -> None:
        await asyncio.sleep(0)  # requests submitted just before close() start, so they get cancelled
        tasks = [t for t in self._tasks if not t.done()]
        for t in tasks:
            t.cancel()
        if self._model_task is not None:
            self._model_task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._session.close()

    async def _judge(self, message: str, n_steps: int, t0: float) -> Verdict:
        task = asyncio.current_task()
        self._tasks.add(task)
        step, error, attempts = None, "", 0
        try:
            model, error = await self._model_name()
            if model:
                body = {"model": model, "messages": [{"role": "user", "content": message}],
                        "max_tokens": self._max_tokens, "temperature": self._temperature, "top_p": self._top_p}
                reply, error, attempts = await self._call("POST", "/chat/completions", body, _content)
                if reply is not None:
                    content, finish = reply
                    step = parse_verdict(content, n_steps, self._template)
                    error = "" if step is not None else TRUNCATED if finish == "length" else "unparseable"
        except asyncio.CancelledError:  # close(): the caller still gets a verdict, not an exception
            error = "closed"
        except Exception as e:  # fail-open: a client bug must not take the training step down
            error = self._redact(f"client error: {type(e).__name__}: {e}")
        finally:
            self._tasks.discard(task)
        latency = time.perf_counter() - t0
        with self._lock:
            self._latencies.append(latency)
            self._failures += step is None
            self._unparseable += error == "unparseable"
            self._truncated += error == TRUNCATED
            first = step is None and error != "closed" and failure_kind(error) not in self._kinds
            if step is None:
                self._kinds[failure_kind(error)] = self._kinds.get(failure_kind(error), 0) + 1
        if first:  # one line per kind between two metrics() calls, not one per request
            why = (f" (the answer reached max_tokens={self._max_tokens} before its verdict)"
                   if error == TRUNCATED else "")
            log.warning("GenRM request failed: %s%s (the step's further failures of this kind are only "
                        "counted in genrm/failures)", error[:300], why)
        return Verdict(step, error=error, attempts=attempts, latency_s=latency)

    async def _model_name(self) -> tuple[str, str]:
        """(model, "") or ("", why): the configured name, else the first id GET /models lists,
        fetched once. Concurrent requests share one lookup; a failed lookup is tried afresh later."""
        if self._model:
            return self._model, ""
        t = self._model_task
        if t is None or t.done() and (t.cancelled() or t.exception() is not None or not t.result()[0]):
            self._model_task = asyncio.ensure_future(self._call("GET", "/models", None, _first_model))
        model, error, _ = await asyncio.shield(self._model_task)
        if model:
            self._model = model
            return model, ""
        return "", f"model list: {error}"

    async def _call(self, method: str, path: str, body: dict | None,
                    extract: Callable[[Any], Any]) -> tuple[Any, str, int]:
        """(value, "", attempts) or (None, why, attempts), with bounded retries that prefer a replica
        not yet tried."""
        tried: set[int] = set()
        error = ""
        for attempt in range(self._max_retries + 1):
            if attempt:
                with self._lock:
                    self._retries += 1
                # Full jitter: uniform in [0, min(cap, base * 2^(attempt-1))].
                cap = min(self._backoff_max_s, self._backoff_base_s * 2 ** (attempt - 1))
                await asyncio.sleep(self._rng.uniform(0, cap))
            async with self._sem:
                rep = self._pick(tried)
                tried.add(rep.index)
                rep.outstanding += 1
                try:
                    value = await self._attempt(rep, method, path, body, extract)
                except _Retryable as e:
                    error = str(e)
                    rep.fails += 1
                    if rep.fails >= self._fail_threshold:
                        rep.down_until = self._loop.time() + self._cooldown_s
                    continue
                except _Final as e:
                    return None, str(e), attempt + 1
                finally:
                    rep.outstanding -= 1
                rep.fails, rep.down_until = 0, 0.0
                return value, "", attempt + 1
        return None, error, self._max_retries + 1

    def _pick(self, avoid: set[int]) -> _Replica:
        """The replica with the fewest outstanding requests among those not cooling down (ties:
        round robin), preferring one not in `avoid`. A replica back from its cool-down takes one
        probe at a time until it succeeds; when none is available, the one whose cool-down ends first."""
        now = self._loop.time()
        up = [r for r in self._replicas
              if r.down_until <= now and not (r.fails >= self._fail_threshold and r.outstanding)]
        if not up:
            return min(self._replicas, key=lambda r: r.down_until)
        up = [r for r in up if r.index not in avoid] or up
        least = min(r.outstanding for r in up)
        n = len(self._replicas)
        best = min((r for r in up if r.outstanding == least), key=lambda r: (r.index - self._rr) % n)
        self._rr = (best.index + 1) % n
        return best

    async def _attempt(self, rep: _Replica, method: str, path: str, body: dict | None,
                       extract: Callable[[Any], Any]) -> Any:
        try:
            async with self._session.request(method, rep.base + path, json=body) as resp:
                if resp.status == 429 or resp.status >= 500:
                    raise _Retryable(f"http {resp.status}")
                if resp.status in (401, 403):
                    if not rep.warned:
                        rep.warned = True
                        log.warning("GenRM server %s refused the API key (HTTP %d): set api_key or %s",
                                    rep.shown, resp.status, API_KEY_ENV)
                    raise _Final(f"refused: {resp.status}")
                if resp.status >= 400:  # the server's reason says what to fix (vLLM: "max_tokens=1024
                    # cannot be greater than max_model_len=256"), which the status alone does not
                    try:
                        reason = self._redact(_server_reason(await self._read_capped(resp, ERROR_BYTES)))
                    except (_Retryable, asyncio.TimeoutError, aiohttp.ClientError):
                        reason = ""  # a body too long or too slow to be a message: the status answers
                    raise _Final(f"http {resp.status}{reason}")
                raw = await self._read_capped(resp)
        except asyncio.TimeoutError:
            raise _Retryable("timeout") from None
        except aiohttp.ClientError as e:
            raise _Retryable(f"connection: {type(e).__name__}") from None
        if json_values(raw) > self._max_values:  # parsed, it would cost many times the cap
            raise _Retryable("reply: too many JSON values")
        try:
            data = json.loads(raw)
        except RecursionError:
            raise _Retryable("non-json reply: nested too deeply") from None
        except ValueError:
            raise _Retryable("non-json reply") from None
        return extract(data)

    async def _read_capped(self, resp: aiohttp.ClientResponse, cap: int | None = None) -> bytes:
        """The reply's body, decoded, or _Retryable once it passes `cap` (max_reply_bytes), declared,
        sent or decoded: what one faulty replica sends must not fill the driver's memory. A refused
        reply's connection is closed at once, neither read further nor drained for reuse."""
        cap = cap or self._max_reply_bytes
        try:
            inflate = _Inflater.for_encoding(resp.headers.get("Content-Encoding", ""))
            if resp.content_length is not None and resp.content_length > cap:
                raise _Retryable(f"reply over {cap} bytes")
            chunks, sent, size = [], 0, 0
            # A piece at a time: what aiohttp holds unread is bounded by the session's read_bufsize
            # (_PIECE, twice that before it stops reading the socket), so a reply costs about `cap`
            # at most (tests/genrm/test_client_memory.py measures it).
            while chunk := await resp.content.read(_PIECE):
                sent += len(chunk)
                pieces = [chunk] if inflate is None else inflate.feed(chunk, cap + 1 - size)
                size += sum(map(len, pieces))
                if sent > cap or size > cap:
                    raise _Retryable(f"reply over {cap} bytes")
                chunks += pieces
            return b"".join(chunks)
        except _Retryable:
            resp.close()
            raise

    def _redact(self, text: str) -> str:
        return hide(text, self._secrets)

    def _reset_counters(self) -> None:
        self._requests = self._failures = self._unparseable = self._truncated = self._retries = 0
        self._latencies: list[float] = []
        self._kinds: dict[str, int] = {}  # failures by kind since the last metrics() call


def failure_kind(error: str) -> str:
    """A Verdict error without its variable detail: 'client error: KeyError: 3' -> 'client error:
    KeyError', 'http 400: max_tokens=...' -> 'http 400'; the client's other errors are their own
    kind ('timeout', 'http 503', ...)."""
    if error.startswith("model list: "):
        return "model list: " + failure_kind(error[len("model list: "):])
    if error.startswith("client error:"):
        return ":".join(error.split(":")[:2])
    if error.startswith("http "):
        return error.split(":", 1)[0]
    return error


VALUE_BYTES = 32
"""A reply may hold one JSON value (a container, a number, a string) per this many bytes of the
cap, and at least MIN_VALUES. Parsed, a value costs 30 to 70 bytes (an empty list or dict
64 and its slot 8: '[],' is 3 bytes, so 4 MB of them parse to 100 MB); at most cap / 32 of them
keep a reply's parse near the cap. A verdict's reply holds a few dozen."""
MIN_VALUES = 16384
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def json_values(raw: bytes) -> int:
    """About how many values json.loads(raw) would make, never fewer (by a count of ',', ':',
    '[' and '{' outside strings): a cheap bound on what parsing costs before it is paid."""
    bare = _STRING.sub(b'""', raw)
    return 1 + sum(bare.count(c) for c in (b",", b":", b"[", b"{"))


_PIECE = 1 << 16
"""The most bytes read, or decoded, at a time."""
ERROR_BYTES = 16 << 10
"""The most of a refusal's body read for its reason: an error message is a line or two."""
REASON_CHARS = 300


def _server_reason(raw: bytes) -> str:
    """': REASON' from an error body, or '' when it has none: the OpenAI form
    {"error": {"message": ...}} (ours, vLLM's), or {"error": "..."}, {"message": ...},
    {"detail": ...}; one line, at most REASON_CHARS characters (a reply is untrusted text)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return ""
    reason = data.get("error", data.get("message", data.get("detail"))) if isinstance(data, dict) else None
    if isinstance(reason, dict):
        reason = reason.get("message")
    if not isinstance(reason, str) or not reason.strip():
        return ""
    reason = " ".join(reason.split())
    return ": " + (reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS] + "...")


class _Inflater:
    """Decodes a gzip or deflate body a piece at a time, never more than asked for at once: a
    compressed reply of a few hundred kilobytes may stand for gigabytes."""

    def __init__(self, wbits: int) -> None:
        self._wbits = wbits
        self._d = zlib.decompressobj(wbits)
        self._started = False

    @staticmethod
    def for_encoding(header: str) -> _Inflater | None:
        """An inflater for a Content-Encoding, None for none; _Retryable for one not asked for."""
        encoding = header.strip().lower()
        if encoding in ("", "identity"):
            return None
        if encoding in ("gzip", "x-gzip"):
            return _Inflater(16 + zlib.MAX_WBITS)
        if encoding == "deflate":
            return _Inflater(zlib.MAX_WBITS)
        raise _Retryable(f"reply in an encoding not asked for: {encoding[:40]}")

    def feed(self, data: bytes, limit: int) -> list[bytes]:
        """At most `limit` bytes decoded from what came so far plus `data` (limit >= 1), in pieces
        of at most _PIECE bytes: one piece as large as the cap would be made twice over."""
        if not self._started and data:
            self._started = True
            if self._wbits == zlib.MAX_WBITS and data[0] & 0x0F != 8:
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)  # "deflate" sent raw, without zlib's header
        out: list[bytes] = []
        try:
            data = self._d.unconsumed_tail + data
            while data and limit > 0:
                piece = self._d.decompress(data, min(limit, _PIECE))
                out.append(piece)
                limit -= len(piece)
                data = self._d.unconsumed_tail
                if not data and self._d.eof and self._d.unused_data:
                    if self._wbits <= zlib.MAX_WBITS:
                        raise _Retryable("reply: broken compressed body")  # data after its deflate stream
                    data = self._d.unused_data  # gzip members one after another (RFC 1952)
                    self._d = zlib.decompressobj(self._wbits)
        except zlib.error:
            raise _Retryable("reply: broken compressed body") from None
        return out


def _content(data: Any) -> tuple[str, str | None]:
    """(choices[0].message.content, choices[0].finish_reason or None when absent or not a string).
    A null content cut at the length limit is an empty answer, not a malformed reply: a server
    that parses reasoning apart (vLLM's --reasoning-parser) sends that when max_tokens ends the
    reasoning, and a retry would be cut again."""
    try:
        choice = data["choices"][0]
        content = choice["message"]["content"]
        finish = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise _Retryable("no choices[0].message.content") from None
    finish = finish if isinstance(finish, str) else None
    if content is None and finish == "length":
        return "", finish
    if not isinstance(content, str):
        raise _Retryable("no choices[0].message.content")
    return content, finish


def _first_model(data: Any) -> str:
    try:
        model = data["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        raise _Retryable("no model listed") from None
    if not isinstance(model, str) or not model:
        raise _Retryable("no model listed")
    return model
