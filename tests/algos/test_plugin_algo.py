"""A new algorithm with a setting of its own is one module and one registry line: registered from
outside the package (tests/algos/plugin_algo.py), its section joins the settings, a dotted
override or a config file sets it, its own checks refuse a bad value with the key named, and the
section is gone again once the line is."""

from __future__ import annotations

import pickle

import pytest

from reasonrl_fast.algos import ALGOS, get_algo
from reasonrl_fast.config import ConfigError, load_config, to_yaml
from tests.algos import plugin_algo


@pytest.fixture
def tempered(monkeypatch):
    monkeypatch.setitem(ALGOS, "tempered", plugin_algo.PATH)  # the one registry line
    return get_algo("tempered")


def test_a_registered_algorithms_setting_is_set_and_read(tempered, tmp_path):
    cfg = load_config(None, ["algo=tempered", "tempered.scale=2.5"])
    assert cfg.tempered.scale == 2.5 and cfg.tempered.mode == "plain" and cfg.flowrl.beta == 15.0
    assert get_algo(cfg.algo) is tempered and tempered.outcome_rewards(cfg, [1.0, 0.0], [True, False],
                                                                       None).tolist() == [2.5, 0.0]
    saved = tmp_path / "config.yaml"  # a run's config.yaml reads back, its section with it
    saved.write_text(to_yaml(cfg))
    assert load_config(str(saved), ["tempered.mode=signed"]).tempered == plugin_algo.TemperedConfig(2.5, "signed")
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # what a worker is sent


@pytest.mark.parametrize("override, message", [
    ("tempered.scale=0", r"^tempered\.scale=0\.0: must be > 0$"),
    ("tempered.mode=loud", r"^tempered\.mode='loud': must be one of \('plain', 'signed'\)$"),
    ("tempered.scale=x", r"^tempered\.scale='x': must be a number"),
    ("tempered.scal=1", r"^config key 'tempered\.scal'"),
])
def test_a_registered_algorithms_setting_is_checked(tempered, override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["algo=tempered", override])


def test_without_its_line_the_section_is_unknown():
    with pytest.raises(ConfigError, match=r"^config key 'tempered'"):
        load_config(None, ["tempered.scale=2"])
    with pytest.raises(ConfigError, match=r"^algo='tempered': must be one of \('flowrl', 'grpo', 'fapo'\)"):
        load_config(None, ["algo=tempered"])


def test_a_registered_algorithm_that_does_not_import_is_named_when_its_settings_are_set(monkeypatch):
    """A typo in the registry line would otherwise read as a typo in the user's key: the unknown-key
    error says which plug-in did not load, and why."""
    monkeypatch.setitem(ALGOS, "tempered", "tests.algos.no_such_module:TemperedAlgo")
    with pytest.raises(ConfigError) as e:
        load_config(None, ["tempered.scale=2"])
    assert str(e.value).startswith("config key 'tempered'"), e.value
    assert ("its section may be a plug-in's that did not load: the algorithm 'tempered' "
            "(tests.algos.no_such_module:TemperedAlgo) could not be imported (ModuleNotFoundError: No module "
            "named 'tests.algos.no_such_module')") in str(e.value), e.value
    with pytest.raises(ConfigError) as e:  # a known section's unknown key says nothing of it
        load_config(None, ["trainer.stepz=2"])
    assert "plug-in" not in str(e.value), e.value
