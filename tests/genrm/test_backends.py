"""The GenRM backend registry: a spec `NAME:ARG` read in one place (parse_backend), an unknown
name answered in one line listing the known backends, and a backend registered from outside the
package (tests/genrm/plugin_backend.py) that the config accepts, the server's CLI builds and
serves, and whose facts (`loads_model`, `templates`) decide `GenRMConfig.local_model` and the
config's template check without any file comparing backend names. Unit tier: in process."""

from __future__ import annotations

import asyncio

import pytest

from reasonrl_fast.config import load_config
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.genrm.backends import BACKENDS, get_backend, local_model, make_backend, parse_backend
from tests.genrm import plugin_backend


@pytest.fixture
def echo(monkeypatch):
    monkeypatch.setitem(BACKENDS, "echo", plugin_backend.PATH)  # the one registry line
    monkeypatch.setitem(BACKENDS, "echomodel", plugin_backend.MODEL_PATH)
    return get_backend("echo")


def test_a_spec_is_split_at_its_first_colon():
    assert parse_backend("rule:addition") == ("rule", "addition")
    assert parse_backend("hf:/models/a:b") == ("hf", "/models/a:b")
    assert parse_backend("hf:") == ("hf", "")


@pytest.mark.parametrize("spec", ["vllm:x", "rule", "", "echo:hi"])
def test_an_unknown_backend_is_one_line_listing_the_known_ones(spec):
    with pytest.raises(ValueError) as e:
        parse_backend(spec)
    msg = str(e.value)
    assert "\n" not in msg and "unknown GenRM backend" in msg and "rule:TASK" in msg and "hf:PATH" in msg, msg
    with pytest.raises(ValueError, match="known backends are rule:TASK, hf:PATH"):
        get_backend("vllm")


def test_local_model_is_the_directory_our_own_server_loads(echo):
    assert load_config(None, ["fapo.genrm.serve=hf:/models/genrm"]).fapo.genrm.local_model == "/models/genrm"
    assert load_config(None, []).fapo.genrm.local_model is None  # the rule judge loads none
    remote = ["fapo.genrm.serve=hf:/models/genrm", "fapo.genrm.addresses=[127.0.0.1:9]"]
    assert load_config(None, remote).fapo.genrm.local_model is None  # replicas the run does not start
    assert load_config(None, ["fapo.genrm.serve=echo:hi"]).fapo.genrm.local_model is None
    assert load_config(None, ["fapo.genrm.serve=echomodel:/m"]).fapo.genrm.local_model == "/m"
    assert local_model([], "echomodel:/m") == "/m" and local_model(["h:1"], "echomodel:/m") is None


def test_a_registered_backend_is_a_serve_choice_and_an_unregistered_one_is_not(echo):
    assert load_config(None, ["algo=fapo", "fapo.genrm.serve=echo:hi"]).fapo.genrm.serve == "echo:hi"
    BACKENDS.pop("echo")
    with pytest.raises(ConfigError, match=r"fapo\.genrm\.serve='echo:hi': unknown GenRM backend 'echo'"):
        load_config(None, ["algo=fapo", "fapo.genrm.serve=echo:hi"])


def test_the_template_check_reads_the_backends_facts(echo):
    """The echo judge reads only "fapo": another rendering is refused naming it; the rule judge
    refuses "published" the same way; a model backend reads any."""
    with pytest.raises(ConfigError, match="template=compact .*the echo judge .*reads fapo"):
        load_config(None, ["algo=fapo", "fapo.genrm.serve=echo:hi", "fapo.genrm.template=compact"])
    with pytest.raises(ConfigError, match="template=published .*the rule judge"):
        load_config(None, ["algo=fapo", "fapo.genrm.template=published"])
    for serve in ("echomodel:/m", "hf:/m"):
        load_config(None, ["algo=fapo", f"fapo.genrm.serve={serve}", "fapo.genrm.template=published"])


def test_a_model_backend_of_a_plugin_gets_the_rehearsals_stand_in(echo):
    from reasonrl_fast.trainer.stand_ins import stand_in_genrm

    assert stand_in_genrm(load_config(None, ["algo=fapo", "fapo.genrm.serve=echomodel:/m"]))
    assert not stand_in_genrm(load_config(None, ["algo=fapo", "fapo.genrm.serve=echo:hi"]))


def test_the_server_builds_and_serves_a_registered_backend(echo, monkeypatch):
    """The serve CLI builds the backend its --backend names through the registry, with the
    server's options; the app answers chat completions from it."""
    from aiohttp.test_utils import TestClient, TestServer

    from reasonrl_fast.genrm import serve

    started = {}

    async def fake_serve(backend, spec, host, port, name, api_key, limits):
        started.update(backend=backend, spec=spec, name=name)

    monkeypatch.setattr(serve, "serve", fake_serve)
    serve._main(["--backend", "echo:hello", "--port", "0", "--max-batch", "3", "--device", "cpu"])
    backend = started["backend"]
    assert isinstance(backend, plugin_backend.Echo) and (backend.word, backend.device, backend.max_batch) == (
        "hello", "cpu", 3)
    assert started["name"] == "echo-hello" and started["spec"] == "echo:hello"
    with pytest.raises(ValueError, match="echo:WORD needs a word"):
        make_backend("echo:", "cpu", 1)

    app = serve.make_app(backend, started["name"], None, started["spec"])

    async def run():
        async with TestClient(TestServer(app, host="127.0.0.1")) as c:
            r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "judge"}]})
            h = await c.get("/health")
            return r.status, await r.json(), await h.json()

    status, reply, health = asyncio.run(run())
    assert status == 200 and reply["choices"][0]["message"]["content"] == "hello \\boxed{-1}", reply
    assert health["backend"] == "echo:hello" and health["echo_calls"] == 1, health


def test_an_unknown_backend_on_the_serve_cli_is_one_line(capsys):
    from reasonrl_fast.genrm import serve

    with pytest.raises(SystemExit) as e:
        serve.main(["--backend", "vllm:x", "--port", "0"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and "unknown GenRM backend 'vllm'" in err and "hf:PATH" in err, err


def test_the_facts_are_read_without_torch():
    """The config checks and the planner ask a backend's facts on machines without torch: the
    hf backend's module imports it only when a server builds one."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = ("import sys; from reasonrl_fast.config import load_config; "
            "g = load_config(None, ['algo=fapo', 'fapo.genrm.serve=hf:/m', 'fapo.genrm.template=published']).fapo.genrm; "
            "print(g.local_model, sorted(m for m in sys.modules if m == 'torch' or m.startswith('transformers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root,
                         env=dict(os.environ, PYTHONPATH=root))
    assert out.returncode == 0 and out.stdout.strip() == "/m []", out.stderr
