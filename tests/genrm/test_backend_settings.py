"""A GenRM backend with a setting of its own: registered from outside the package
(tests/genrm/plugin_backend.py, one registry line), its section hangs under fapo.genrm, a dotted
override sets it, its own check refuses a bad value with the key named, and two backends of one
class share the one section."""

from __future__ import annotations

import pickle

import pytest

from reasonrl_fast.config import ConfigError, load_config
from reasonrl_fast.genrm.backends import BACKENDS
from tests.genrm import plugin_backend


@pytest.fixture
def echo(monkeypatch):
    monkeypatch.setitem(BACKENDS, "echo", plugin_backend.PATH)  # the one registry line
    monkeypatch.setitem(BACKENDS, "echomodel", plugin_backend.MODEL_PATH)  # a subclass: the same section


def test_a_registered_backends_setting_is_set_and_read(echo):
    cfg = load_config(None, ["algo=fapo", "fapo.genrm.serve=echo:hi", "fapo.genrm.echo.repeat=3"])
    assert cfg.fapo.genrm.echo == plugin_backend.EchoConfig(repeat=3)
    assert cfg.fapo.genrm.serve == "echo:hi" and cfg.fapo.genrm.local_model is None and cfg.fapo.penalty == 1.0
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # the extended fapo.genrm section travels to a worker


@pytest.mark.parametrize("override, message", [
    ("fapo.genrm.echo.repeat=0", r"^fapo\.genrm\.echo\.repeat=0: must be > 0$"),
    ("fapo.genrm.echo.repeat=1.5", r"^fapo\.genrm\.echo\.repeat=1\.5: must be a whole number"),
    ("fapo.genrm.echo=2", r"^fapo\.genrm\.echo=2: a section, not a value"),
])
def test_a_registered_backends_setting_is_checked(echo, override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["algo=fapo", "fapo.genrm.serve=echo:hi", override])


def test_without_its_line_the_section_is_unknown():
    with pytest.raises(ConfigError, match=r"^config key 'fapo\.genrm\.echo'"):
        load_config(None, ["fapo.genrm.echo.repeat=2"])
