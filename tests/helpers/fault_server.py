"""A small OpenAI-compatible GenRM server for the client's tests, with fault modes.

    python tests/genrm/fault_server.py --mode MODE --port P [--delay S] [--key K] [--model NAME]

Prints `listening PORT` on stdout once it accepts connections. Modes (POST /v1/chat/completions):
  ok            the right verdict for an addition request (the rule the GenRM learns)
  delay, slow   sleep --delay seconds, then as ok (delay: a slow-ish replica; slow: past a timeout)
  http500       always HTTP 500                 nonjson     HTTP 200 with an HTML body
  nochoices     JSON without choices            nobox       content without \\boxed{}
  out_of_range  \\boxed{} with a step index past the last step
  flaky         the odd-numbered chat requests get HTTP 500, the others as ok
  key           requires `Authorization: Bearer --key` (also on /v1/models), else HTTP 401
GET /v1/models lists --model, GET /health answers ok, GET /stats gives the counters: `chat`
(chat requests received), `generated` (verdicts written), `models`, `refused` and `errors`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from aiohttp import web

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from reasonrl_fast.tasks.addition import first_wrong_step, parse_problem  # noqa: E402
from reasonrl_fast.protocol import parse_request  # noqa: E402

MODES = ("ok", "delay", "slow", "http500", "nonjson", "nochoices", "nobox", "out_of_range", "flaky", "key")


def make_app(mode: str, delay: float, key: str, model: str) -> web.Application:
    stats = {"chat": 0, "generated": 0, "models": 0, "refused": 0, "errors": 0}

    def authorized(request: web.Request) -> bool:
        if mode != "key" or request.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        stats["refused"] += 1
        return False

    def reply(content: str) -> web.Response:
        stats["generated"] += 1
        return web.json_response({"id": "x", "object": "chat.completion", "model": model, "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]})

    async def chat(request: web.Request) -> web.Response:
        stats["chat"] += 1
        n = stats["chat"]
        if not authorized(request):
            return web.json_response({"error": {"message": "invalid api key"}}, status=401)
        if mode == "http500" or mode == "flaky" and n % 2 == 1:
            stats["errors"] += 1
            return web.json_response({"error": {"message": "internal"}}, status=500)
        if mode == "nonjson":
            return web.Response(text="<html>502 bad gateway</html>", content_type="text/html")
        if mode == "nochoices":
            return web.json_response({"object": "chat.completion", "choices": []})
        body = await request.json()
        parsed = parse_request(body["messages"][-1]["content"])
        ab = parse_problem(parsed[0]) if parsed else None
        if ab is None:
            return web.json_response({"error": {"message": "not an addition request"}}, status=400)
        steps = parsed[2]
        if mode in ("delay", "slow"):
            await asyncio.sleep(delay)
        if mode == "nobox":
            return reply("Every step looks fine to me.")
        if mode == "out_of_range":
            return reply(f"The earliest wrong step is \\boxed{{{len(steps) + 3}}}.")
        return reply(f"Checking the columns in order. \\boxed{{{first_wrong_step(*ab, steps)}}}")

    async def models(request: web.Request) -> web.Response:
        stats["models"] += 1
        if not authorized(request):
            return web.json_response({"error": {"message": "invalid api key"}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def get_stats(request: web.Request) -> web.Response:
        return web.json_response(stats)

    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", chat), web.get("/v1/models", models),
                    web.get("/health", health), web.get("/stats", get_stats)])
    return app


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=MODES, default="ok")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--delay", type=float, default=None, help="seconds (default: delay 0.05, slow 60)")
    p.add_argument("--key", default="secret")
    p.add_argument("--model", default="fault-genrm")
    a = p.parse_args()
    delay = a.delay if a.delay is not None else (60.0 if a.mode == "slow" else 0.05)
    runner = web.AppRunner(make_app(a.mode, delay, a.key, a.model), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", a.port, reuse_address=True)
    await site.start()
    port = runner.addresses[0][1]
    print(f"listening {port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
