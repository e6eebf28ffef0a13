"""aiohttp apps served on a free loopback port from a thread of the test's own process (so a test
can script a server's every reply), all stopped and cleaned up when the block ends, also when the
test fails."""

from __future__ import annotations

import asyncio
import contextlib
import threading


@contextlib.contextmanager
def app_server():
    """Yields serve(app, **AppRunner kwargs) -> "127.0.0.1:PORT"."""
    from aiohttp import web

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runners = []

    def serve(app, **runner_kwargs) -> str:
        async def up():
            runner = web.AppRunner(app, access_log=None, **runner_kwargs)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            runners.append(runner)
            return f"127.0.0.1:{runner.addresses[0][1]}"
        return asyncio.run_coroutine_threadsafe(up(), loop).result(10)

    try:
        yield serve
    finally:
        for r in runners:
            asyncio.run_coroutine_threadsafe(r.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
