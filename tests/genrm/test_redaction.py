"""No message of the GenRM client, its launcher or FAPO's judge holds a secret: neither the
password of an address written as http://user:password@host/v1 nor the API key. Each message a
user can see is gathered, an error, a log line, a verdict's error, replica_status(), and searched
for both. The replicas are aiohttp apps on loopback that refuse, echo the key or are not there."""

from __future__ import annotations

import json
import logging
import socket

import pytest
from aiohttp import web

from reasonrl_fast.config import ConfigError, load_config
from reasonrl_fast.genrm.client import GenRMClient
from reasonrl_fast.redact import REDACTED, hide, redact_url, secrets_of
from reasonrl_fast.genrm.launch import GenRMStartError, launch
from reasonrl_fast.protocol import API_KEY_ENV
from reasonrl_fast.trainer.fapo import Judge
from tests.helpers.loopback import app_server

pytestmark = pytest.mark.proc  # real connections on loopback, a server process

USER, PASSWORD, KEY = "genrmuser", "S3cret-Pa55word", "sk-Key-0123456789"
SECRETS = (PASSWORD, KEY, f"{USER}:{PASSWORD}")
FAST = dict(backoff_base_s=0.01, backoff_max_s=0.02, model="m", template="compact", max_retries=1,
            timeout_s=5)
REQUEST = [("11+22=", "33", ["3", "3"])]


def assert_clean(*texts: object) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in str(text), f"{secret!r} in {text!r}"


def with_credentials(address: str, password: str = PASSWORD) -> str:
    """'127.0.0.1:PORT' -> 'http://USER:PASSWORD@127.0.0.1:PORT/v1'."""
    return f"http://{USER}:{password}@{address}/v1"


def dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once it is closed


@pytest.fixture(autouse=True)
def no_key_in_env(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)


@pytest.fixture
def replica():
    """replica(status, message) -> '127.0.0.1:PORT' of a server that answers every request with
    `status` and the OpenAI error `message` (a 200 gets a verdict); it records the Authorization
    headers it saw."""
    seen: list[str] = []

    def start(serve, status: int, message: str = "") -> str:
        async def answer(request: web.Request) -> web.Response:
            seen.append(request.headers.get("Authorization", ""))
            await request.read()
            if status == 200:
                body = {"choices": [{"message": {"role": "assistant", "content": "\\boxed{-1}"}}]}
            else:
                body = {"error": {"message": message, "type": "Error", "code": status}}
            return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        return serve(app)

    with app_server() as serve:
        yield lambda status, message="": start(serve, status, message), seen


def test_redact_url():
    assert redact_url("http://u:p@h:8000/v1") == f"http://{REDACTED}@h:8000/v1"
    assert redact_url("https://user:pa%40ss@gpu-1.lan:443/prefix/v1") == f"https://{REDACTED}@gpu-1.lan:443/prefix/v1"
    assert redact_url("u:p@h:8000") == f"{REDACTED}@h:8000"
    assert redact_url("http://u:pa/ss@h:1/v1") == f"http://{REDACTED}@h:1/v1"  # an unencoded '/' in the password
    assert redact_url("http://u:p@ss@h:1/v1") == f"http://{REDACTED}@h:1/v1"  # and an unencoded '@'
    assert redact_url("http://h:8000/v1") == "http://h:8000/v1"
    assert redact_url("h:8000") == "h:8000" and redact_url("") == ""


def test_hide_hides_the_secrets_of_addresses_and_keys():
    secrets = secrets_of([with_credentials("h:1", "p%40ss-word"), "h:2"], KEY, "")
    assert set(secrets) == {KEY, f"{USER}:p%40ss-word", f"{USER}:p@ss-word", "p%40ss-word", "p@ss-word"}
    text = f"Bearer {KEY} for {USER}:p@ss-word and p%40ss-word"
    assert hide(text, secrets) == f"Bearer {REDACTED} for {REDACTED} and {REDACTED}"
    assert secrets_of(["http://u:p@h:1/v1"], "k") == []  # too short to search free text for


@pytest.mark.parametrize("address, why", [
    (f"http://{USER}:{PASSWORD}@127.0.0.1:99999/v1", "out of range"),
    (f"http://{USER}:{PASSWORD}@127.0.0.1:8000/chat", "the path must be empty or end in /v1"),
    (f"{USER}:{PASSWORD}@127.0.0.1:8000", "a bare address must be 'host:port'"),
])
def test_a_bad_address_is_refused_without_its_password(address, why):
    with pytest.raises(ValueError, match=why) as e:
        GenRMClient([address], **FAST)
    assert_clean(str(e.value), repr(e.value))
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_credentials_and_a_key_together_are_refused_once_without_either(monkeypatch):
    """aiohttp refuses a request with both (each one a 'client error: ValueError'); the client
    says so when it is made, naming the address without its credentials."""
    address = with_credentials("127.0.0.1:8000")
    with pytest.raises(ValueError, match=r"'http://<redacted>@127.0.0.1:8000/v1' carries credentials .* give one") as e:
        GenRMClient([address], api_key=KEY, **FAST)
    assert_clean(str(e.value))
    monkeypatch.setenv(API_KEY_ENV, KEY)  # the key from the environment counts the same
    with pytest.raises(ValueError, match="carries credentials") as e:
        GenRMClient([address], **FAST)
    assert_clean(str(e.value))


def test_connection_failures_say_nothing_of_the_credentials(caplog):
    with caplog.at_level(logging.DEBUG, logger="reasonrl_fast"), \
            GenRMClient([with_credentials(dead_address()), with_credentials(dead_address())], **FAST) as c:
        verdicts = c.judge(REQUEST * 3)
        status = c.replica_status()
    assert all(v.step is None and v.error.startswith("connection") for v in verdicts), verdicts
    assert [s["address"].startswith(f"http://{REDACTED}@127.0.0.1:") for s in status] == [True, True], status
    assert caplog.records
    assert_clean(*verdicts, status, *(r.getMessage() for r in caplog.records))


def test_a_refused_key_is_logged_without_the_key_or_the_password(replica, caplog):
    """The 401 warning names the server; the server's reason, which may quote the key it got,
    comes back without it."""
    start, seen = replica
    refuse = start(401, f"invalid key {KEY}")
    echo = start(400, f"Bearer {KEY} is not allowed")
    with caplog.at_level(logging.DEBUG, logger="reasonrl_fast"):
        with GenRMClient([with_credentials(refuse)], **FAST) as c:
            by_password = c.judge(REQUEST)
        with GenRMClient([refuse], api_key=KEY, **FAST) as c:
            by_key = c.judge(REQUEST)
        with GenRMClient([echo], api_key=KEY, **FAST) as c:
            echoed = c.judge(REQUEST)
    assert [v.error for v in by_password + by_key] == ["refused: 401"] * 2
    assert echoed[0].error == f"http 400: Bearer {REDACTED} is not allowed", echoed
    logged = [r.getMessage() for r in caplog.records]
    assert sum(f"GenRM server http://{REDACTED}@{refuse}/v1 refused the API key" in m for m in logged) == 1, logged
    assert sum(f"GenRM server http://{refuse}/v1 refused the API key" in m for m in logged) == 1, logged
    assert_clean(*by_password, *by_key, *echoed, *logged)
    assert seen[0].startswith("Basic ") and seen[1] == f"Bearer {KEY}"  # the secrets were still sent


def test_an_unexpected_error_is_reported_without_the_secrets(replica):
    """A bug of ours or a library's exception may quote the URL or the headers: the verdict's
    'client error' keeps its text, without the client's secrets."""
    start, _ = replica
    verdicts = []
    for address, key in [(with_credentials(start(200)), ""), (start(200), KEY)]:
        def request(method, url, **kw):  # what the session was given, quoted back
            raise RuntimeError(f"cannot {method} {url} with 'Authorization: Bearer {key}'")

        with GenRMClient([address], api_key=key, **FAST) as c:
            c._session.request = request
            verdicts += c.judge(REQUEST)
    assert [v.error.startswith("client error: RuntimeError: cannot POST http://") for v in verdicts] == [True] * 2
    assert f"http://{REDACTED}@127.0.0.1:" in verdicts[0].error and f"Bearer {REDACTED}" in verdicts[1].error, verdicts
    assert_clean(*verdicts)


def test_a_launch_that_fails_does_not_show_its_key(tmp_path):
    """The error quotes the server's command line and its log's end: a key given as api_key (in
    the environment) or as --api-key (on the command line) is shown redacted."""
    with pytest.raises(GenRMStartError) as e:
        launch(f"nonsense:{KEY}", api_key=KEY, extra_args=["--api-key", PASSWORD, f"--api-k={PASSWORD}"],
               start_timeout_s=30)
    message = str(e.value)
    assert f"--api-key {REDACTED} --api-k={REDACTED}" in message and f"nonsense:{REDACTED}" in message, message
    assert_clean(message)


def test_fapo_judge_refuses_credentials_with_a_key_in_one_line():
    cfg = load_config(None, ["algo=fapo", f"fapo.genrm.addresses=[{with_credentials('127.0.0.1:8000')}]",
                             f"fapo.genrm.api_key={KEY}", "fapo.genrm.max_retries=0"])
    with pytest.raises(ConfigError, match=r"fapo.genrm: GenRMClient: address 'http://<redacted>@127.0.0.1:8000/v1'") as e:
        Judge(cfg, log=print)
    assert_clean(str(e.value))


def test_fapo_judge_warns_without_the_password():
    lines: list[str] = []
    cfg = load_config(None, ["algo=fapo", f"fapo.genrm.addresses=[{with_credentials(dead_address())}]",
                             "fapo.genrm.max_retries=0", "fapo.genrm.timeout_s=5"])
    judge = Judge(cfg, log=lines.append)
    try:
        for i in range(2):
            judge.submit(i, {"prompt": "11+22=", "answer": "33", "data_source": "addition"}, "3,3 \\boxed{33}")
        verdicts, _ = judge.collect()
    finally:
        judge.close()
    assert len(lines) == 1 and "2 of 2 GenRM verdicts failed" in lines[0], lines
    assert_clean(*lines, *verdicts.values())
