"""The tool box: each call in a worker process, its answer or an error observation, never an
exception; a hang ends at rollout.tool_timeout_s with the worker killed (and what it started);
a flood is cut; a crash or an allocation past the worker's memory is an error; the box goes on.
Tools load by registered name or 'module:function', and one without a schema is refused, named."""

import os
import time

import pytest

from reasonrl_fast.errors import ConfigError
from reasonrl_fast.registry import TOOLS
from reasonrl_fast.tools.box import ToolBox

pytestmark = pytest.mark.proc  # real tool worker processes

H = "tests.helpers.tool_fns:"


@pytest.fixture(scope="module")
def box():
    with ToolBox(["calculator", H + "shout", H + "count", H + "fails", H + "hangs", H + "floods", H + "hogs",
                  H + "exits", H + "spawns"], num_workers=2, timeout_s=2.0, max_chars=100, memory_mb=512) as b:
        yield b


def test_calls_answer_in_order_and_failures_are_observations(box, tmp_path):
    obs, m = box.call([("calculator", {"expression": "37*48"}), ("shout", "hey"), ("count", {"n": 3}),
                       ("fails", {"x": 1}), ("nope", {}), ("shout", {"text": "a", "extra": 1}),
                       ("calculator", {"expression": "2**10**9"}), ("count", [1])])
    assert [o.text for o in obs[:3]] == ["1776", "HEY", "[1, 2, 3]"]
    assert [o.status for o in obs] == ["ok"] * 3 + ["error"] * 5
    assert obs[3].text == "error: KeyError: 'no entry 1'"
    assert obs[4].text.startswith("error: no tool is called 'nope'; the tools are calculator, shout")
    assert "unexpected keyword argument 'extra'" in obs[5].text
    assert "digits" in obs[6].text and "must be a JSON object" in obs[7].text
    assert m["tool/calls"] == 8 and m["tool/errors"] == 5 and m["tool/timeouts"] == 0


def test_a_hang_a_flood_a_hog_and_an_exit_are_contained(box, tmp_path):
    marker = tmp_path / "child"
    t = time.monotonic()
    obs, m = box.call([("hangs", {"x": 1}), ("floods", {"x": 1}), ("hogs", {"x": 1}), ("exits", {"x": 1}),
                       ("spawns", {"path": str(marker)}), ("calculator", "1+1")])
    took = time.monotonic() - t
    assert [o.status for o in obs] == ["timeout", "ok", "error", "error", "timeout", "ok"], obs
    assert "ran past rollout.tool_timeout_s=2.0" in obs[0].text
    assert len(obs[1].text) < 200 and obs[1].text.endswith("[... 9999900 more characters]")
    assert "MemoryError" in obs[2].text and "died" in obs[3].text and obs[5].text == "2"
    assert m["tool/timeouts"] == 2 and m["tool/errors"] == 2
    assert took < 15, took  # two timeouts of 2 s (two workers) and a worker restart or three
    time.sleep(max(0.0, t + 5 - time.monotonic()))  # the killed worker's child would have written by now
    assert not marker.exists(), "a tool's child outlived its timeout"
    assert box.call([("shout", "still here")])[0][0].text == "STILL HERE"


def test_a_tool_is_a_registered_name_or_a_path_with_a_schema():
    assert TOOLS["calculator"] == "reasonrl_fast.tools.calculator:calculator"
    with ToolBox(["python", H + "shout"], timeout_s=20) as b:
        names = [s["function"]["name"] for s in b.schemas]
        assert names == ["python", "shout"] and b.names == names
        params = b.schemas[1]["function"]["parameters"]
        assert params == {"type": "object", "properties": {"text": {"type": "string", "description": "The text."}},
                          "required": ["text"]}
    for spec, why in [("abacus", "unknown tool 'abacus'"), (H + "missing", "cannot be imported"),
                      (H + "undocumented", "has no tool schema"), ("tests.helpers.tool_fns:os", "module, not a function"),
                      ("", "not a tool name")]:
        with pytest.raises(ConfigError, match=why):
            ToolBox([spec])
    with pytest.raises(ValueError, match="two tools are called 'shout'"):
        ToolBox([H + "shout", H + "shout"])


def test_the_workers_leave_with_the_box():
    b = ToolBox([H + "shout"], num_workers=2)
    pids = [s.proc.pid for s in b._slots]
    assert b.call([("shout", "x")])[0][0].text == "X"
    b.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
