"""`meshrl network up` on a terminal: where to look, once, then one status line redrawn."""

from __future__ import annotations

import asyncio
import io
import json
from types import SimpleNamespace

import pytest

from meshrl.network.status import UpStatus, trainer_progress


class _Popen:
    def __init__(self, rc):
        self.rc = rc

    def poll(self):
        return self.rc


def test_trainer_progress_reads_the_metrics_tail(tmp_path) -> None:
    m = tmp_path / "metrics.jsonl"
    assert trainer_progress(m) == "starting"
    m.write_text("\n".join(json.dumps(r) for r in [
        {"kind": "sft", "step": 3}, {"kind": "eval", "accuracy": 0.25, "step": 3},
        {"kind": "step", "step": 7}]) + "\n")
    assert trainer_progress(m) == "rl step 7, accuracy 0.25"


def test_status_line_is_redrawn_in_place(tmp_path) -> None:
    out = io.StringIO()
    st = UpStatus(tmp_path, out, enabled=True)
    st.header({"dashboard": "http://127.0.0.1:18555", "join": ""})
    procs = {"a": SimpleNamespace(popen=_Popen(None), restarts=1),
             "b": SimpleNamespace(popen=_Popen(1), restarts=0)}
    st.tick(procs, force=True)
    st.tick(procs, force=True)
    st.end()
    text = out.getvalue()
    assert text.startswith("meshrl network: dashboard http://127.0.0.1:18555\n")
    assert "join" not in text  # an empty URL is not printed
    assert text.count("\r\x1b[2K") == 2 and "roles 1/2 up, 1 restarts | trainer starting" in text
    quiet = io.StringIO()
    UpStatus(tmp_path, quiet, enabled=False).tick(procs, force=True)
    assert quiet.getvalue() == ""


def test_the_join_url_printed_is_one_worker_join_takes(tmp_path) -> None:
    """`network up` of a public pool prints its join URL; `meshrl worker join URL` reads the
    manifest at `URL/join` (worker/join.py). A real orchestrator stand-in on loopback records
    the path asked: it must be `/join`, not `/join/join` (404, as a stranger saw it)."""
    from aiohttp import web

    from meshrl.config import load_config
    from meshrl.network.config import NetworkConfig
    from meshrl.network.roles import Layout
    from meshrl.network.up import where_to_look
    from meshrl.worker.join import JoinError, fetch_manifest

    asked: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        asked.append(request.path)
        if request.path != "/join":
            return web.Response(status=404)
        return web.json_response({"pool_id": 0})  # a manifest's path, not a manifest

    async def scenario() -> str:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", anything)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            lay = Layout(load_config(NetworkConfig, [], [
                "--dir", str(tmp_path), "--public_host", "127.0.0.1",
                "--base_port", str(port - 2)]))  # the orchestrator is base_port + 2
            url = where_to_look(lay)["join"]
            out = io.StringIO()
            UpStatus(tmp_path, out, enabled=False).header({"join": url})
            assert out.getvalue() == f"meshrl network: join {url}\n"
            with pytest.raises(JoinError) as e:
                await fetch_manifest(url, timeout_s=10)
            return str(e.value)
        finally:
            await runner.cleanup()

    error = asyncio.run(scenario())
    assert asked == ["/join"]
    assert "is not a join manifest" in error  # it reached the manifest (404 before)


def test_worker_join_takes_the_pool_url_also_as_its_manifests() -> None:
    """A join URL passed on with its manifest's path (`.../join`, a trailing slash) is the same
    pool: `worker join` asks `URL/join` once, never `/join/join`."""
    from meshrl.config import load_config
    from meshrl.worker.config import JoinConfig

    for given in ("http://10.0.0.5:8600", "http://10.0.0.5:8600/", "http://10.0.0.5:8600/join",
                  " http://10.0.0.5:8600/join/ "):
        assert load_config(JoinConfig, [], ["--url", given]).url == "http://10.0.0.5:8600"
