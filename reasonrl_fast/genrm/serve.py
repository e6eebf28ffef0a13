"""An OpenAI-compatible GenRM server: `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`.

    python -m reasonrl_fast.genrm.serve --backend rule:addition|hf:PATH [--host 127.0.0.1]
        [--port 8000] [--max-batch 64] [--api-key KEY] [--served-model-name NAME] [--device auto]
        [--max-in-flight 64] [--max-reading 256] [--max-queued 1024] [--queue-timeout-s 10]
        [--idle-timeout-s 15] [--body-timeout-s 15] [--completion-timeout-s 300]

Backends (`--backend NAME:ARG`, a name of genrm/backends.py's registry `BACKENDS`):
- `rule:addition`: the exact judge of the embedded addition task (no model, tasks/addition.py): it
  reads the request written by `protocol.render` ("fapo" or "compact"), checks the steps against the right column
  work and answers like a model would, a line per step checked and then `\\boxed{k}`. Its token
  counts are characters, and an answer cut at `max_tokens` ends with finish_reason "length". A
  "published" request (the raw solution, no step boundaries) is answered 400, saying so
  (genrm/rule_backend.py).
- `hf:PATH`: a local Hugging Face causal LM; concurrent requests are batched into one `generate`
  call (genrm/hf_backend.py).
- any backend a plug-in registers with one line, `BACKENDS["name"] = "package.module:Class"`.

Once it accepts connections the server prints one line, `GenRM server listening on
http://HOST:PORT/v1`, to stdout (a parent that started it with `--port 0` reads the port there)
and then sends its stdout to stderr. SIGTERM and SIGINT stop it. `launch()` (genrm/launch.py)
starts one as a subprocess. `stop` strings cut the answer after generation; generation itself does
not end at them.

No client can hold the server (`Limits`): a connection that sends no complete request headers
within the idle timeout is closed, a body that does not arrive within the body timeout is answered
408, a declared body over the cap 413 before it is read (and before `100 Continue`). A request
first takes a reading place (bodies being read or waiting for a slot, `max_reading`), waiting for
one with its body unread; only with its body read and parsed does it take an in-flight slot, so
clients that send their bodies slowly hold reading places, never the slots that completions need.
A wait past the queue's length or time limit gets 503 with `Retry-After`, and a completion over
its time limit 504. The rule judge runs in a worker thread
and parses in linear time, so the event loop (and `/health`) keeps answering while it works.
A host other than loopback needs an API key, or `--allow-open-without-key`.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import ipaddress
import json
import math
import os
import resource
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import HttpVersion11, web

from reasonrl_fast import cli
from reasonrl_fast.errors import UserError
from reasonrl_fast.genrm.launch import DEFAULT_MAX_BATCH
from reasonrl_fast.genrm.backends import make_backend
from reasonrl_fast.genrm.rule_backend import RuleBackend  # noqa: F401 (the default backend, as serve.RuleBackend)
from reasonrl_fast.protocol import API_KEY_ENV, Backend, RequestError, Sampling

MAX_BODY_BYTES = 4 * 1024 * 1024  # a GenRM request is a problem and a solution: far below this
_ROLES = ("system", "developer", "user", "assistant", "tool")
# After an answer sent before the body was read (413, 503, 408), aiohttp reads and drops the rest
# for this long (or the body timeout, if shorter) so that the client sees the answer rather than
# a reset; then the socket closes.
_LINGER_S = 2.0
# Set on a request that asked `Expect: 100-continue`: read_body sends it when the body is wanted.
_CONTINUE = "genrm.send_100_continue"

# aiohttp keeps an idle keep-alive connection's last request and answer until its next request:
# after a request or answer this large the connection closes, so that many idle clients of
# megabyte requests do not hold gigabytes (benchmarks/RESULTS.md §5).
_KEEP_ALIVE_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What one client may hold of the server; every wait on a client has an end."""

    max_body_bytes: int = MAX_BODY_BYTES
    """Largest request body; a larger declared Content-Length is refused before it is read."""
    max_in_flight: int = 64
    """Chat completions judged or generated, and their answers sent, at once; a request takes a
    slot only once its body is read and parsed."""
    max_reading: int = 256
    """Chat completions whose body is being read, or read and waiting for a slot: with
    max_in_flight this bounds the memory that bodies and their parsing take, and it is the number
    of clients sending bodies slowly (each for at most body_timeout_s) that it takes to hold
    requests back; more wait for a place, their bodies unread."""
    max_queued: int = 1024
    """Requests waiting for a reading place; one more is answered 503 (with Retry-After) at once."""
    queue_timeout_s: float = 10.0
    """Longest wait for a reading place, and then for a slot; over either, 503 (with Retry-After)."""
    idle_timeout_s: float = 15.0
    """A connection without complete request headers this long after it opened (or after its
    last answer) is closed: this also ends a client that sends its headers slowly."""
    body_timeout_s: float = 15.0
    """Reading one request body (a body not all there by then is answered 408), and sending one
    answer (a client that has not taken it all by then is disconnected)."""
    completion_timeout_s: float = 300.0
    """One completion (judging or generating); over it the request is answered 504."""

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_in_flight", "max_reading", "queue_timeout_s", "idle_timeout_s",
                     "body_timeout_s", "completion_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):  # inf: a wait that never ends
                raise ValueError(f"{name}={value!r}: must be a finite number > 0")
        if self.max_queued < 0:
            raise ValueError(f"max_queued={self.max_queued!r}: must be >= 0")


# ---------------------------------------------------------------- request validation


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def parse_messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages must be a non-empty list of {role, content}", "messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object with role and content", where)
        role, content = m.get("role"), m.get("content")
        if role not in _ROLES:
            raise RequestError(f"{where}.role must be one of {list(_ROLES)}, got {role!r}", f"{where}.role")
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, list):
            parts = []
            for j, p in enumerate(content):
                if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                    raise RequestError(f"{where}.content[{j}] must be {{\"type\": \"text\", \"text\": str}}",
                                       f"{where}.content")
                parts.append(p["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise RequestError(f"{where}.content must be a string or a list of text parts", f"{where}.content")
        out.append({"role": role, "content": content})
    return out


def parse_chat(body: Any, served_name: str) -> tuple[list[dict[str, str]], Sampling, list[str]]:
    """(messages, sampling, stop strings) of a chat completion request, or a RequestError."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", None)
    model = body.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise RequestError("model must be a string", "model")
        if model != served_name:
            raise RequestError(f"The model `{model}` does not exist (this server serves `{served_name}`)",
                               "model", status=404, code="model_not_found", kind="NotFoundError")
    if "messages" not in body:
        raise RequestError("messages is required", "messages")
    messages = parse_messages(body["messages"])
    max_tokens = None
    for key in ("max_completion_tokens", "max_tokens"):
        v = body.get(key)
        if v is not None:
            if not _is_int(v) or v < 1:
                raise RequestError(f"{key} must be an integer >= 1, got {v!r}", key)
            max_tokens = v
            break
    temperature = body.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if not _is_num(temperature) or not 0 <= temperature <= 2:
        raise RequestError(f"temperature must be a number in [0, 2], got {temperature!r}", "temperature")
    top_p = body.get("top_p", 1.0)
    if top_p is None:
        top_p = 1.0
    if not _is_num(top_p) or not 0 < top_p <= 1:
        raise RequestError(f"top_p must be a number in (0, 1], got {top_p!r}", "top_p")
    n = body.get("n", 1)
    if n is not None and (not _is_int(n) or n != 1):
        raise RequestError(f"n must be 1 (one choice per request), got {n!r}", "n")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise RequestError(f"seed must be an integer, got {seed!r}", "seed")
    if body.get("stream"):
        raise RequestError("stream is not supported: send stream=false", "stream")
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("stop must be a string or a list of non-empty strings", "stop")
    return messages, Sampling(max_tokens, float(temperature), float(top_p), seed), stops


# ---------------------------------------------------------------- the HTTP application


def error_response(e: RequestError, headers: dict[str, str] | None = None,
                   close: bool = False) -> web.Response:
    body = {"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.code}}
    resp = web.json_response(body, status=e.status, headers=headers)
    if close:
        resp.force_close()
    return resp


def parse_json(raw: bytes) -> Any:
    """The request body's JSON, or a 400 naming what is wrong with it (the json module's own
    errors: bad syntax or encoding, nesting past the recursion limit, an integer of more than
    4300 digits)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise RequestError("the request body is not valid JSON: it is nested too deeply", "body",
                           code="json_too_deep") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, the integer digit limit
        raise RequestError(f"the request body is not valid JSON: {e}", "body") from None


def make_app(backend: Backend, served_name: str, api_key: str | None, backend_spec: str,
             limits: Limits = Limits()) -> web.Application:
    state = {"completions": 0, "in_flight": 0, "reading": 0, "queued": 0, "busy": 0}
    # Two stages, each first come, first served: a reading place while the body arrives and is
    # parsed (and then waits for a slot), and a slot for judging or generating. A client that sends
    # its body slowly holds a reading place for at most body_timeout_s, and never a slot.
    reading = asyncio.Semaphore(limits.max_reading)
    slots = asyncio.Semaphore(limits.max_in_flight)
    want = f"Bearer {api_key}".encode() if api_key else None

    def unauthorized(request: web.Request) -> web.Response | None:
        if want is None or not request.path.startswith("/v1/"):
            return None
        if hmac.compare_digest(request.headers.get("Authorization", "").encode(), want):
            return None
        return error_response(RequestError("missing or wrong API key (send 'Authorization: Bearer KEY')",
                                           None, 401, "invalid_api_key", "AuthenticationError"))

    @web.middleware
    async def guard(request: web.Request, handler):
        v1 = request.path.startswith("/v1/")
        refused = unauthorized(request)
        if refused is not None:
            return refused
        try:
            return await handler(request)
        except RequestError as e:
            return error_response(e, close=e.close)
        except web.HTTPException as e:  # 404, 405, 413 from aiohttp itself, in the OpenAI form
            if not v1 or e.status < 400:
                raise
            message = (f"the request body is larger than {limits.max_body_bytes} bytes" if e.status == 413
                       else f"{e.reason}: {request.method} {request.path}")
            return error_response(RequestError(message, None, e.status, str(e.status), type(e).__name__),
                                  close=e.status == 413)
        except Exception as e:  # noqa: BLE001 - a bug answers 500 in the API's format; the server goes on
            print(f"[genrm] {request.method} {request.path} failed: {type(e).__name__}: {e}", file=sys.stderr,
                  flush=True)
            return error_response(RequestError(f"internal error: {type(e).__name__}", None, 500, "internal_error",
                                               "InternalServerError"), close=True)

    def too_large(request: web.Request) -> RequestError | None:
        declared = request.content_length
        if declared is None or declared <= limits.max_body_bytes:
            return None
        return RequestError(f"the request body is larger than {limits.max_body_bytes} bytes "
                            f"(Content-Length: {declared})", None, 413, "413", "HTTPRequestEntityTooLarge",
                            close=True)

    async def expect(request: web.Request) -> web.Response | None:
        """`Expect: 100-continue`: aiohttp's own handler sends `100 Continue` as soon as the request
        is routed, inviting a body the server may refuse. Here a wrong key (401) or a declared body
        over the cap (413) is answered at once instead, and `100 Continue` waits until the body is
        about to be read (read_body), after the wait for a reading place."""
        refused = unauthorized(request)
        if refused is not None:
            refused.force_close()  # the body will not come: its client waits for 100 Continue
            return refused
        error = too_large(request)
        if error is not None:
            return error_response(error, close=True)
        if request.headers.get("Expect", "").lower() != "100-continue":
            return error_response(RequestError(f"Expect: {request.headers.get('Expect')!r} is not supported "
                                               f"(only 100-continue)", None, 417, "417", "ExpectationFailed"),
                                  close=True)
        request[_CONTINUE] = request.version == HttpVersion11
        return None

    async def read_body(request: web.Request) -> bytes:
        try:
            async with asyncio.timeout(limits.body_timeout_s):
                if request.get(_CONTINUE):
                    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    request.writer.output_size = 0  # the answer's own size is counted from here
                return await request.read()  # over client_max_size: HTTPRequestEntityTooLarge (413)
        except TimeoutError:
            raise RequestError(f"the request body did not arrive within {limits.body_timeout_s:g} s", None, 408,
                               "request_timeout", "RequestTimeoutError", close=True) from None
        except ConnectionError:  # the client went away mid-body: an answer nobody reads, and no log
            raise RequestError("the connection closed before the body arrived", None, 400, "connection_lost",
                               "BadRequestError", close=True) from None

    def busy(why: str) -> web.Response:
        state["busy"] += 1
        return error_response(RequestError(f"the server is busy ({why}): retry later", None, 503, "server_busy",
                                           "ServiceUnavailableError"), headers={"Retry-After": "1"})

    async def acquire_in_time(semaphore: asyncio.Semaphore) -> bool:
        """Whether `semaphore` was taken within the queue time limit."""
        try:
            async with asyncio.timeout(limits.queue_timeout_s):
                await semaphore.acquire()
            return True
        except TimeoutError:
            return False

    async def chat(request: web.Request) -> web.Response:
        error = too_large(request)  # refused before a byte is read, and before any wait
        if error is not None:
            raise error
        # A request waits for a reading place with its body unread: what waits holds a socket.
        if reading.locked() and state["queued"] >= limits.max_queued:
            return busy(f"{limits.max_reading} requests being read or waiting for a slot and "
                        f"{state['queued']} waiting to be read")
        state["queued"] += 1
        try:
            placed = await acquire_in_time(reading)
        finally:
            state["queued"] -= 1
        if not placed:
            return busy(f"no place to read the request within {limits.queue_timeout_s:g} s")
        state["reading"] += 1
        try:
            raw = await read_body(request)
            messages, sampling, stops = parse_chat(parse_json(raw), served_name)
            size = len(raw)
            if not await acquire_in_time(slots):
                return busy(f"no free slot within {limits.queue_timeout_s:g} s")
        finally:
            state["reading"] -= 1
            reading.release()
        state["in_flight"] += 1
        try:
            resp = await complete(messages, sampling, stops, size)
            # The answer is sent inside the slot too (else answers nobody reads yet pile up in
            # memory), and within the body time limit: a client that does not read is cut off.
            try:
                async with asyncio.timeout(limits.body_timeout_s):
                    await resp.prepare(request)
                    await resp.write_eof()
            except TimeoutError:
                if request.transport is not None:
                    request.transport.abort()
            return resp
        finally:
            state["in_flight"] -= 1
            slots.release()

    async def complete(messages: list[dict[str, str]], sampling: Sampling, stops: list[str],
                       body_size: int) -> web.Response:
        try:
            async with asyncio.timeout(limits.completion_timeout_s):
                c = await backend.complete(messages, sampling)
        except RequestError:
            raise
        except TimeoutError:
            raise RequestError(f"the completion took longer than {limits.completion_timeout_s:g} s", None, 504,
                               "timeout", "GatewayTimeoutError") from None
        except Exception as e:  # noqa: BLE001 - one failed generation answers 500, the server goes on
            print(f"[genrm] generation failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            raise RequestError(f"generation failed: {type(e).__name__}: {e}", None, 500,
                               "internal_error", "InternalServerError") from None
        text, finish = c.text, c.finish_reason
        cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
        if cuts:
            text, finish = text[: min(cuts)], "stop"
        state["completions"] += 1
        resp = web.json_response({
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": served_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                      "total_tokens": c.prompt_tokens + c.completion_tokens},
        })
        if body_size + len(resp.body) > _KEEP_ALIVE_MAX_BYTES:
            resp.force_close()
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": served_name, "object": "model", "created": created, "owned_by": "reasonrl_fast"}]})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "backend": backend_spec, "model": served_name,
                                  "completions": state["completions"], "in_flight": state["in_flight"],
                                  "reading": state["reading"], "queued": state["queued"],
                                  "busy_refused": state["busy"], **backend.stats()})

    created = int(time.time())
    app = web.Application(middlewares=[guard], client_max_size=limits.max_body_bytes)
    app.router.add_post("/v1/chat/completions", chat, expect_handler=expect)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def raise_fd_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (many systems start at
    1024, which a thousand idle sockets use up); returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft


def is_loopback(host: str) -> bool:
    """Whether binding `host` is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name other than localhost, or "" (every interface)
        return False


async def serve(backend: Backend, spec: str, host: str, port: int, served_name: str,
                api_key: str | None, limits: Limits = Limits()) -> None:
    """Serve until SIGTERM or SIGINT."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    # aiohttp's keep-alive timer also runs from the moment a connection opens and closes it while
    # no complete request has arrived: it is the header timeout too.
    runner = web.AppRunner(make_app(backend, served_name, api_key, spec, limits), access_log=None,
                           keepalive_timeout=limits.idle_timeout_s,
                           lingering_time=min(_LINGER_S, limits.body_timeout_s))
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=1024)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # the real port when --port 0
        # One write with its newline: a parent that reads up to the newline then closes the pipe
        # must not leave a second write to fail with EPIPE.
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), f"GenRM server listening on http://{host}:{bound}/v1\n".encode())
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # later output goes to the log
        await stopping.wait()
    finally:
        await runner.cleanup()
        close = getattr(backend, "close", None)
        if close is not None:
            close()


class ServeError(UserError):
    """The server cannot start as asked (a bad backend, an open bind without a key, a port it
    cannot listen on); the message says why."""


def main(argv: list[str] | None = None) -> None:
    return cli.main(_main, argv)


def _main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m reasonrl_fast.genrm.serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Limits()
    p.add_argument("--backend", required=True,
                   help="rule:addition, hf:PATH (a local model directory) or another registered NAME:ARG")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=int, default=8000, help="0 takes a free port")
    p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, help="hf: most requests in one generate call")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                   help=f"require 'Authorization: Bearer KEY' on /v1/* (default: ${API_KEY_ENV})")
    p.add_argument("--allow-open-without-key", action="store_true",
                   help="serve a host other than loopback without an API key (a network you trust)")
    p.add_argument("--served-model-name", default=None, help="the model name clients send")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="hf: where the model runs")
    p.add_argument("--max-in-flight", type=int, default=None,
                   help=f"completions at once, more get 503 (default: the larger of {d.max_in_flight} and --max-batch)")
    p.add_argument("--max-reading", type=int, default=d.max_reading,
                   help="completions whose body is being read, or read and waiting for a slot")
    p.add_argument("--max-queued", type=int, default=d.max_queued,
                   help="completions waiting to be read; one more gets 503 at once")
    p.add_argument("--queue-timeout-s", type=cli.positive_number, default=d.queue_timeout_s,
                   help="answer 503 to a completion that waited this long to be read, or then for a slot")
    p.add_argument("--idle-timeout-s", type=cli.positive_number, default=d.idle_timeout_s,
                   help="close a connection without complete request headers this long")
    p.add_argument("--body-timeout-s", type=cli.positive_number, default=d.body_timeout_s,
                   help="answer 408 to a request body not all there this long after its headers")
    p.add_argument("--completion-timeout-s", type=cli.positive_number, default=d.completion_timeout_s,
                   help="answer 504 to a completion that takes longer")
    a = p.parse_args(argv)
    if not 0 <= a.port <= 65535:
        p.error(f"--port {a.port}: expected 0..65535")
    if a.max_batch < 1:
        p.error(f"--max-batch {a.max_batch}: expected >= 1")
    for flag in ("max_in_flight", "max_reading"):
        v = getattr(a, flag)
        if v is not None and not v > 0:
            p.error(f"--{flag.replace('_', '-')} {v}: expected > 0")
    if a.max_queued < 0:
        p.error(f"--max-queued {a.max_queued}: expected >= 0")
    limits = Limits(max_in_flight=a.max_in_flight or max(d.max_in_flight, a.max_batch), max_reading=a.max_reading,
                    max_queued=a.max_queued,
                    queue_timeout_s=a.queue_timeout_s, idle_timeout_s=a.idle_timeout_s,
                    body_timeout_s=a.body_timeout_s, completion_timeout_s=a.completion_timeout_s)
    if not is_loopback(a.host) and not a.api_key:
        if not a.allow_open_without_key:
            raise ServeError(f"--host {a.host} is reachable from other machines and no API key is set: "
                             f"give --api-key (or ${API_KEY_ENV}), or --allow-open-without-key on a network "
                             f"you trust")
        print(f"genrm.serve: warning: serving {a.host} without an API key (--allow-open-without-key): anyone "
              f"who reaches this port can use it", file=sys.stderr, flush=True)
    raise_fd_limit()
    try:
        backend = make_backend(a.backend, a.device, a.max_batch)
    except (ValueError, FileNotFoundError, ImportError) as e:  # each names the backend or its model
        raise ServeError(f"--backend {a.backend}: {e}") from None
    name = a.served_model_name or backend.default_name
    try:
        asyncio.run(serve(backend, a.backend, a.host, a.port, name, a.api_key, limits))
    except OSError as e:  # the port is taken, the host cannot be bound
        raise ServeError(f"cannot listen on {a.host}:{a.port}: {e}") from None


if __name__ == "__main__":
    main()
