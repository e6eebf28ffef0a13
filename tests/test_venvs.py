"""The offline policy of the cached venvs (tests/helpers/venvs.py): a registry out of reach skips
the test with the reason; a registry that answers but cannot give what the venv needs fails it.
Both registries are local: nothing listening on a loopback port, and an empty index served on
another (about 10 s: two venvs are created)."""

import functools
import http.server
import os
import socket
import threading

import pytest

from tests.helpers import venvs

pytestmark = pytest.mark.proc  # venvs and pip in child processes, an index server

INSTALLS = [["reasonrl-fast-no-such-package==1.0"]]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no request lines in the test's output
        pass


@pytest.fixture
def pip_env(tmp_path, monkeypatch):
    monkeypatch.setattr(venvs, "ROOT", tmp_path / "venvs")
    # pip's configuration files and the machine's local wheels out of the way: only the index
    # each case sets is asked
    for key, value in {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": "",
                       "PIP_RETRIES": "0", "PIP_DEFAULT_TIMEOUT": "10"}.items():
        monkeypatch.setenv(key, value)
    return monkeypatch


def test_registry_out_of_reach_skips(pip_env):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pip_env.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple")
    with pytest.raises(pytest.skip.Exception, match=r"venv-probe cannot be built: the package registry is out of reach \(http://127\.0\.0\.1"):
        venvs.python_or_skip("venv-probe", INSTALLS, 120)
    assert not (venvs.ROOT / "venv-probe" / ".complete").exists()


def test_registry_without_the_release_fails(pip_env, tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(index)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        pip_env.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_address[1]}/")
        with pytest.raises(pytest.fail.Exception, match="with the package registry in reach") as e:
            venvs.python_or_skip("venv-probe", INSTALLS, 120)
        assert "reasonrl-fast-no-such-package" in str(e.value)
    finally:
        server.shutdown()
        server.server_close()
    assert not (venvs.ROOT / "venv-probe" / ".complete").exists()


def test_changed_installs_rebuild(pip_env, tmp_path):
    """A cached venv is reused only while its marker lists the same installs."""
    python, built = venvs.ensure_venv("venv-empty", [], 120)
    assert built > 0 and python.exists()
    assert venvs.ensure_venv("venv-empty", [], 120) == (python, 0.0)
    (venvs.ROOT / "venv-empty" / ".complete").write_text("torch==0.1\n")  # an older pin
    assert venvs.ensure_venv("venv-empty", [], 120)[1] > 0
