"""Reading records (verl schema and flat), checking ground truths, rendering prompts."""

import json

import pytest

from reasonrl_fast.data.records import encode_prompts, filter_long, load_records, problem_text, prompt_ids, render_prompt
from reasonrl_fast.models.tiny import char_tokenizer

from tests.helpers.chat_tokenizer import templated_tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1="}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def verl_row(**over):
    row = {"data_source": "aime24", "prompt": MESSAGES, "ability": "math",
           "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {"split": "test", "index": 3}}
    return {**row, **over}


def test_verl_schema_read_back(tmp_path):
    code_truth = {"inputs": ["1\n"], "outputs": ["2\n"]}
    genrm_extra = {"problem": "p", "answer": "4", "steps": ["a", "b"], "split": "train"}
    rows = [verl_row(), verl_row(data_source="codecontests", ability=None, reward_model={"ground_truth": code_truth}),
            verl_row(data_source="genrm", ability=None, reward_model={"ground_truth": "1"}, extra_info=genrm_extra),
            verl_row(ability="MATH", reward_model={"ground_truth": 12})]
    a, b, c, d = load_records(write_jsonl(tmp_path / "v.jsonl", rows))
    assert a == {"prompt": MESSAGES, "answer": "2", "data_source": "aime24", "ability": "math",
                 "extra_info": {"split": "test", "index": 3}}
    assert (b["ability"], json.loads(b["answer"])) == ("code", code_truth)  # a test object is serialised
    assert (c["ability"], c["answer"], c["extra_info"]["steps"]) == ("genrm", "1", ["a", "b"])
    assert (d["ability"], d["answer"]) == ("math", "12")  # a number is read as its string


def test_flat_records(tmp_path):
    rows = [{"question": "2+2=", "answer": 4},
            {"problem": "def f():", "ground_truth": json.dumps({"test": "pass", "entry_point": "f"}),
             "data_source": "humaneval_x"}]
    a, b = load_records(write_jsonl(tmp_path / "f.jsonl", rows))
    assert (a["prompt"], a["answer"], a["data_source"], a["ability"], a["extra_info"]) == ("2+2=", "4", "math", "math", None)
    assert (b["ability"], b["prompt"]) == ("code", "def f():")


def test_render_with_and_without_chat_template():
    plain, chat = char_tokenizer(), templated_tokenizer()
    # without a template: today's format, the contents joined by newlines (embedded runs unchanged)
    assert render_prompt({"prompt": MESSAGES}, plain) == "Be brief.\n1+1="
    assert render_prompt(MESSAGES, chat) == "<|system|>Be brief.\n<|user|>1+1=\n<|assistant|>"
    assert render_prompt("12+34=", chat) == "12+34="  # a string stays as it is
    # a record rendered once keeps its messages: rendering again gives the same text
    rendered = {"prompt": render_prompt(MESSAGES, chat), "messages": MESSAGES}
    assert render_prompt(rendered, chat) == rendered["prompt"]
    assert problem_text(rendered) == "Be brief.\n1+1="
    # the bare problem a record keeps apart (the published FAPO data's extra_info.question) wins
    assert problem_text({**rendered, "extra_info": {"question": "1+1="}}) == "1+1="
    assert problem_text({**rendered, "extra_info": {"question": "  "}}) == "Be brief.\n1+1="
    assert prompt_ids(rendered, chat) == chat(rendered["prompt"], add_special_tokens=False)["input_ids"]
    # the length filter counts the rendered prompt: the template's 30-odd characters tip it over
    short = [{"prompt": MESSAGES, "answer": "2"}]
    assert filter_long(short, plain, 20, "t") == short
    with pytest.warns(UserWarning, match="dropped 1"), pytest.raises(ValueError, match="empty"):
        filter_long(short, chat, 20, "t")


def _byte_level_bpe():
    """A byte-level BPE tokenizer as Qwen's are made (merges learned here, offline), with added
    special tokens, a BOS its post-processor adds, and a chat template of those tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe.train_from_iterator(["12+34=46 the sum of two numbers, Ünïcode 日本"] * 20,
                            trainers.BpeTrainer(vocab_size=400, special_tokens=special,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = bpe.token_to_id("<|endoftext|>")
    bpe.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                  additional_special_tokens=special[1:])
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tok


def test_prompts_encoded_together_are_each_prompt_encoded_alone():
    """One tokenizer call for many records gives each record's ids in its place: chat messages
    (the template's special tokens, none added), rendered records, and plain strings (the
    tokenizer's own special tokens), mixed in one list, with and without a chat template, and
    through transformers' call where the Rust tokenizer has settings of its own."""
    rendered = {"prompt": render_prompt(MESSAGES, templated_tokenizer()), "messages": MESSAGES}
    records = [{"prompt": "12+34="}, {"prompt": MESSAGES}, rendered, {"prompt": ""}, {"prompt": MESSAGES[1:]}]
    truncating = char_tokenizer()  # a tokenizer file's own truncation: transformers' call overrides it
    truncating.backend_tokenizer.enable_truncation(3)
    records += [{"prompt": "  Ünïcode ½ + ∑ 日本 \t\n<|im_start|>user\nx<|im_end|> 12+34="},
                {"prompt": [{"role": "user", "content": "Ünïcode 日本 <|im_end|>"}]}]
    for tok in (char_tokenizer(), templated_tokenizer(), truncating, _byte_level_bpe()):
        templated = bool(tok.chat_template)
        together = encode_prompts(records, tok)  # first: transformers' own call clears the truncation
        alone = [tok(render_prompt(r, tok), add_special_tokens=not (templated and "messages" in r or
                                                                     isinstance(r["prompt"], list) and templated))
                 ["input_ids"] for r in records]
        assert together == alone == [prompt_ids(r, tok) for r in records]
        assert encode_prompts([], tok) == []


@pytest.mark.parametrize("row,key,message", [
    (verl_row(reward_model={"ground_truth": {"x": 1}}), "reward_model.ground_truth", "must be a string"),
    (verl_row(reward_model={"ground_truth": "  "}), "reward_model.ground_truth", "empty"),
    (verl_row(ability="code", reward_model={"ground_truth": "not json"}), "reward_model.ground_truth", "not valid JSON"),
    (verl_row(ability="code", reward_model={"ground_truth": {"test": "x", "entry_point": "f", "prompt": 3}}),
     "reward_model.ground_truth", "'prompt'.*must be a string"),
    (verl_row(ability="code", reward_model={"ground_truth": {"inputs": ["1"], "outputs": []}}),
     "reward_model.ground_truth", "same length"),
    (verl_row(ability="code", reward_model={"ground_truth": {"test": "x", "entry_point": "no name"}}),
     "reward_model.ground_truth", "identifier"),
    (verl_row(ability="code", reward_model={"ground_truth": {"tests": []}}), "reward_model.ground_truth", "needs"),
    (verl_row(ability="genrm", reward_model={"ground_truth": "-2"}), "reward_model.ground_truth", ">= -1"),
    (verl_row(ability="genrm", reward_model={"ground_truth": "5"},
              extra_info={"problem": "p", "answer": "1", "steps": ["a"]}), "reward_model.ground_truth", "past the last"),
    (verl_row(ability="genrm", reward_model={"ground_truth": "0"}, extra_info={"problem": "p"}), "extra_info", r"lacks \['answer', 'steps'\]"),
    (verl_row(prompt=[{"role": "user"}]), "prompt", "must be a message"),
    ({"prompt": "q", "answer": [1, {"a": 2}]}, "answer", "must be a string"),
])
def test_bad_ground_truth_names_file_row_key(tmp_path, row, key, message):
    f = write_jsonl(tmp_path / "bad.jsonl", [verl_row(), row])
    with pytest.raises(ValueError, match=rf"{f}:2: " + (rf"`{key}.*" if key else "") + message):
        load_records(f)


def test_empty_files(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match=rf"{empty}: the file is empty"):
        load_records(str(empty))


def test_parquet_columns_and_empty(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "v.parquet"
    pq.write_table(pa.Table.from_pylist([verl_row(), verl_row(reward_model={"style": "rule", "ground_truth": "7"})]), f)
    a, b = load_records(str(f))
    assert (a["prompt"], a["answer"], b["answer"], b["extra_info"]["index"]) == (MESSAGES, "2", "7", 3)
    wrong = tmp_path / "w.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": "x", "label": 1}]), wrong)
    with pytest.raises(ValueError, match=r"w\.parquet: a records file needs a prompt column.*columns are \['text', 'label'\]"):
        load_records(str(wrong))
    empty = tmp_path / "e.parquet"
    pq.write_table(pa.Table.from_pylist([verl_row()]).slice(0, 0), empty)
    with pytest.raises(ValueError, match=r"e\.parquet: the file is empty"):
        load_records(str(empty))
