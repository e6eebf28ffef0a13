"""runtime/datasets.py: the record files a run reads, held to what the recipe says they carry."""

import json

import pytest

from reasonrl_fast.config import load_config
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.models.tiny import char_tokenizer
from reasonrl_fast.runtime.datasets import load_datasets


def _file(path, *sources):
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1), "data_source": s}) + "\n"
                            for i, s in enumerate(sources)))
    return path


def test_a_declared_data_source_must_be_carried_by_its_files_records(tmp_path):
    a = _file(tmp_path / "a.jsonl", "math_dapo", "math_dapo")
    b = _file(tmp_path / "b.jsonl", "aime24")
    files = [f"data.train_files=[{a}]", f"data.val_files=[{a},{b}]"]
    train, val = load_datasets(load_config(None, [*files, "data.train_sources=[math_dapo]",
                                                  "data.val_sources=[math_dapo,aime24]"]), char_tokenizer())
    assert len(train) == 2 and [(v.name, len(v.records)) for v in val] == [("", 3)]
    assert load_datasets(load_config(None, files), char_tokenizer())  # not declared: the records say
    # the boxed variant of the same set is another source: a recipe naming the wrong one stops here
    with pytest.raises(ConfigError, match=r"data\.train_sources\[0\]='math_dapo_boxed', but the records of "
                                          r".*a\.jsonl carry 'math_dapo'"):
        load_datasets(load_config(None, [*files, "data.train_sources=[math_dapo_boxed]"]), char_tokenizer())
    with pytest.raises(ConfigError, match=r"data\.val_sources\[1\]='math_dapo'"):
        load_datasets(load_config(None, [*files, "data.val_sources=[math_dapo,math_dapo]"]), char_tokenizer())
    sets = f"data.val_sets=[{{name: dapo, files: [{a}], sources: [math_dapo]}}, {{name: aime, files: [{b}], sources: [math_dapo]}}]"
    with pytest.raises(ConfigError, match=r"data\.val_sets\[1\]\.sources\[0\]='math_dapo', but the records of .*b\.jsonl"):
        load_datasets(load_config(None, [files[0], sets]), char_tokenizer())


def test_validation_sets_each_read_their_own_files_at_their_own_settings(tmp_path):
    a = _file(tmp_path / "a.jsonl", "math_dapo", "math_dapo")
    b = _file(tmp_path / "b.jsonl", "aime24")
    cfg = load_config(None, [f"data.train_files=[{a}]", "rollout.val_temperature=0.6", "rollout.val_n=3",
                             f"data.val_sets=[{{name: dapo, files: [{a}], n: 2}}, "
                             f"{{name: aime, files: [{b}], n: 8, k: [1, 8], maj: true, top_p: 0.7}}]"])
    _, sets = load_datasets(cfg, char_tokenizer())
    assert [(v.name, len(v.records), v.n, v.ks, v.maj, v.temperature, v.top_p) for v in sets] == [
        ("dapo", 2, 2, [2], False, 0.6, 1.0), ("aime", 1, 8, [1, 8], True, 0.6, 0.7)]
    assert [r["data_source"] for r in sets[1].records] == ["aime24"]
    # training files without validation files or sets: no validation
    assert load_datasets(load_config(None, [f"data.train_files=[{a}]"]), char_tokenizer())[1] == []
