"""A hostile shardcast server for tests, run as its own process: it answers each GET path from a
spec file and everything else with 404.

    python hostile.py SPEC.json      prints its URL on stdout, serves until killed

The spec maps a path (without the query) to `{"status": 200, "json": <value>}`, `{"body": str}`,
`{"file": path}` (bytes from a file) or `{"repeat": [str, n]}` (a string n times: big bodies).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from aiohttp import web


def _body(spec: dict) -> bytes:
    if "json" in spec:
        return json.dumps(spec["json"]).encode()
    if "file" in spec:
        return Path(spec["file"]).read_bytes()
    if "repeat" in spec:
        text, n = spec["repeat"]
        return (text * n).encode()
    return spec.get("body", "").encode()


async def main(spec_path: str) -> None:
    routes = json.loads(Path(spec_path).read_text())

    async def handle(request: web.Request) -> web.Response:
        spec = routes.get(request.path)
        if spec is None:
            return web.Response(status=404)
        return web.Response(status=spec.get("status", 200), body=_body(spec),
                            content_type="application/octet-stream")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    print(f"http://{host}:{port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
