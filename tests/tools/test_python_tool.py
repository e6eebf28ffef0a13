"""The `python` tool (a code interpreter in the code reward's sandbox) against the policy's hostile
programs: a loop, a fork bomb, a flood of output, reading the trainer's files or environment, the
network. Each gets an error observation (or an answer without the secret) within its limits, and
the box answers the next call."""

import os
import time

import pytest

from reasonrl_fast.tools.box import ToolBox
from reasonrl_fast.tools.python import TIMEOUT_S

pytestmark = pytest.mark.proc  # real sandboxed processes

SECRET = "rrl-secret-3f1c"


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    secret = tmp_path_factory.mktemp("trainer") / "answers.txt"
    secret.write_text(SECRET)
    os.environ["RRL_TOOL_SECRET"] = SECRET  # the trainer's environment, which its tool workers inherit
    try:
        with ToolBox(["python"], num_workers=2, timeout_s=TIMEOUT_S + 10, max_chars=500) as b:
            b.secret_path = str(secret)
            yield b
    finally:
        del os.environ["RRL_TOOL_SECRET"]


def test_a_program_prints_its_answer(box):
    obs, m = box.call([("python", "print(37*48)"), ("python", {"code": "import math\nprint(math.factorial(20))"})])
    assert [o.text for o in obs] == ["1776\n", "2432902008176640000\n"] and m["tool/errors"] == 0


def test_hostile_programs_get_error_observations_within_their_limits(box):
    programs = {
        "loop": "while True:\n    pass",
        "fork bomb": "import os\nwhile True:\n    os.fork()",
        "flood": "while True:\n    print('x' * 10000)",
        "trainer's file": f"print(open({box.secret_path!r}).read())",
        "trainer's environment": "import os\nprint(dict(os.environ))",
        "network": "import socket\nprint(socket.create_connection(('127.0.0.1', 80), timeout=2))",
        "raises": "1/0",
    }
    t = time.monotonic()
    obs, m = box.call([("python", p) for p in programs.values()])
    took = time.monotonic() - t
    got = dict(zip(programs, obs))
    for name, o in got.items():
        assert SECRET not in o.text, name
    assert got["loop"].status == "error" and f"ran past {TIMEOUT_S:g} s" in got["loop"].text
    assert got["fork bomb"].status == "error"
    assert got["flood"].status == "error" and "printed too much" in got["flood"].text
    assert got["trainer's file"].status == "error" and "No such file" in got["trainer's file"].text
    assert got["trainer's environment"].status == "ok" and "RRL_TOOL_SECRET" not in got["trainer's environment"].text
    assert got["network"].status == "error"
    assert got["raises"].status == "error" and "ZeroDivisionError" in got["raises"].text
    assert m["tool/timeouts"] == 0  # the sandbox's own limits ended them, not the box's
    assert took < 4 * (TIMEOUT_S + 5), took
    assert box.call([("python", "print('next')")])[0][0].text == "next\n"
