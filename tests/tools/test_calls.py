"""Call formats (tools/calls.py): the plain form `<NAME>ARGUMENT</NAME>` read from the end of a
turn, the Qwen/Hermes `<tool_call>` JSON blocks with every malformed call a problem the policy is
told, and the observations rendered as the tokenizer's chat template would (a Qwen2.5-style
template over the character tokenizer, the stand-in for a real model's)."""

import json

import pytest

from reasonrl_fast.config.sections import TOOL_FORMATS
from reasonrl_fast.models.tiny import char_tokenizer
from reasonrl_fast.tools.calls import FORMATS, MAX_CALLS, Call, template_continuation

# Qwen2.5's chat template's shape: a turn per message ended by the EOS token, consecutive tool
# messages as one user turn of <tool_response> blocks.
QWEN_STYLE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- eos_token + '\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + eos_token + '\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def test_the_formats_are_the_configs_choices():
    assert tuple(FORMATS) == TOOL_FORMATS


def test_plain_reads_the_call_a_turn_ends_with():
    f, tools = FORMATS["plain"], ["calculator", "python"]
    assert f.stops(tools) == ["</calculator>", "</python>"]
    assert f.parse("so <calculator>37*48</calculator>", tools) == [Call("calculator", "37*48")]
    assert f.parse("<calculator>1</calculator> then <calculator>2+2</calculator>  ", tools) == [Call("calculator", "2+2")]
    assert f.parse("<python>print(1)\n</python>", tools) == [Call("python", "print(1)\n")]
    assert f.parse("\\boxed{12}", tools) == [] and f.parse("<calculator>3", tools) == []
    assert f.parse("3</calculator>", tools)[0].problem == "error: </calculator> without <calculator> before it"
    assert f.observe(["1776"]) == "<result>1776</result>"


def test_hermes_reads_every_block_and_names_what_is_malformed():
    f, tools = FORMATS["hermes"], ["calculator"]
    assert f.stops(tools) == []
    turn = ('I will compute.<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"3*3\\"}"}</tool_call>')
    assert f.parse(turn, tools) == [Call("calculator", {"expression": "2+2"}), Call("calculator", {"expression": "3*3"})]
    assert f.parse("no calls here", tools) == []
    bad = {"<tool_call>{oops</tool_call>": "not JSON", "<tool_call>[1, 2]</tool_call>": '{"name"',
           '<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>': "not a JSON object",
           '<tool_call>{"name": "calculator", "arguments": "nope"}</tool_call>': "not a JSON object",
           "<tool_call>" + "[" * 100000 + "</tool_call>": "characters",
           "<tool_call>" + "[" * 5000 + "</tool_call>": "not JSON"}
    for text, why in bad.items():
        (call,) = f.parse(text, tools)
        assert call.problem is not None and why in call.problem, (text[:40], call)
    many = "".join('<tool_call>{"name": "calculator", "arguments": {}}</tool_call>' for _ in range(MAX_CALLS + 1))
    assert "tool calls in one turn" in f.parse(many, tools)[0].problem


def test_hermes_observations_are_the_templates_tool_turn_after_the_sampled_one():
    tok = char_tokenizer()
    tok.chat_template = QWEN_STYLE
    eos = tok.eos_token
    text = FORMATS["hermes"].observe(["1776", "9"], tok)
    assert text == (f"\n<|im_start|>user\n<tool_response>\n1776\n</tool_response>\n<tool_response>\n9\n"
                    f"</tool_response>{eos}\n<|im_start|>assistant\n")
    # the conversation the template renders whole is the sampled turn, its EOS, then this text
    convo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
             {"role": "tool", "content": "1776"}, {"role": "tool", "content": "9"}]
    whole = tok.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
    assert whole.endswith("a" + eos + text)
    tok.chat_template = "{% for m in messages %}{{ m.content }}\n{% endfor %}"  # no EOS after a turn
    with pytest.raises(ValueError, match="does not end an assistant turn with the EOS token"):
        template_continuation(tok, [{"role": "tool", "content": "1"}])
    tok.chat_template = None
    with pytest.raises(ValueError, match="rollout.tool_format=plain"):
        template_continuation(tok, [{"role": "tool", "content": "1"}])
    json.dumps(text)
