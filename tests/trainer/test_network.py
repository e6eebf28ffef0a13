"""A local run keeps to loopback and to its lifetime: every socket that any process of the run
(driver, Ray's daemons and agents, workers) listens on is a loopback address, and a `kill -9` of
the driver leaves no process behind. Also: an unreachable cluster address and too few nodes
fail fast, naming the problem."""

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from reasonrl_fast.util import read_metrics
from tests.helpers.train import ROOT, TINY, sft_cache
from tests.helpers.procs import alive, children

pytestmark = pytest.mark.e2e  # each test starts Ray, or a run that does

TAG = "REASONRL_TEST_RUN"


def run_processes(root: int, tag: str) -> set[int]:
    """The driver's descendants, and every live process that inherited the run's tag (a process
    re-parented away from the driver still belongs to the run)."""
    kids, todo, out = children(), [root], set()
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo += kids.get(p, [])
    needle = f"{TAG}={tag}".encode()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        out.add(int(name))
            except OSError:
                continue
    return {p for p in out if alive(p)}


def _decode(hexaddr: str, v6: bool) -> str:
    raw = bytes.fromhex(hexaddr)
    if v6:  # four host-order 32-bit words
        return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return socket.inet_ntop(socket.AF_INET, raw[::-1])


def listening_sockets(pids: set[int]) -> list[tuple[str, str, int, int]]:
    """(proto, address, port, pid) of every TCP socket in LISTEN and every unconnected UDP socket
    that one of `pids` holds, from /proc/net/{tcp,tcp6,udp,udp6} and /proc/<pid>/fd."""
    owner = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:["):
                    owner[target[8:-1]] = pid
        except OSError:
            continue
    out = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        with open(f"/proc/net/{proto}") as f:
            next(f)
            for line in f:
                cols = line.split()
                local, state, inode = cols[1], cols[3], cols[9]
                # TCP in LISTEN (0A); UDP unconnected (07): a connected UDP socket is a client's
                if inode not in owner or state != ("0A" if proto.startswith("tcp") else "07"):
                    continue
                host, port = local.split(":")
                out.append((proto, _decode(host, proto.endswith("6")), int(port, 16), owner[inode]))
    return out


def is_loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return "?"


@pytest.fixture(scope="module")
def killed_local_run(tmp_path_factory):
    """One local training run: the listening sockets of its processes, sampled while it starts
    and trains, then what is left of it after a `kill -9` of the driver."""
    tmp = tmp_path_factory.mktemp("net")
    out, tag = tmp / "run", uuid.uuid4().hex
    env = dict(os.environ, **{TAG: tag})
    env.pop("RAY_ADDRESS", None)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "reasonrl_fast.train", *TINY, f"sft.cache_dir={sft_cache(tmp)}",
           "trainer.steps=1000", "trainer.val_every=0", f"trainer.output_dir={out}"]
    log = open(tmp / "driver.log", "w")
    driver = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    seen: dict[tuple, str] = {}
    names: set[str] = set()
    try:
        deadline = time.monotonic() + 300
        metrics = out / "metrics.jsonl"
        steps_seen = 0
        while time.monotonic() < deadline and driver.poll() is None:
            pids = run_processes(driver.pid, tag)
            names |= {_cmd(p) for p in pids}
            for proto, addr, port, pid in listening_sockets(pids):
                seen.setdefault((proto, addr, port), _cmd(pid))
            if metrics.exists():
                steps_seen = len(read_metrics(metrics))
                if steps_seen >= 2:  # trained a while with everything up: kill it mid-run
                    break
            time.sleep(0.3)
        assert driver.poll() is None, f"the run ended early:\n{(tmp / 'driver.log').read_text()[-3000:]}"
        assert steps_seen >= 2, f"no training step within the deadline:\n{(tmp / 'driver.log').read_text()[-3000:]}"
        before = run_processes(driver.pid, tag)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        t0 = time.monotonic()
        left = run_processes(driver.pid, tag)
        while left and time.monotonic() - t0 < 15:
            time.sleep(0.5)
            left = run_processes(driver.pid, tag)
        yield {"seen": seen, "names": names, "before": before,
               "left": {p: _cmd(p) for p in left}, "waited_s": time.monotonic() - t0}
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for pid in run_processes(driver.pid, tag):  # clean up after a failure
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        log.close()


def test_local_run_listens_on_loopback_only(killed_local_run):
    seen, names = killed_local_run["seen"], killed_local_run["names"]
    assert any("raylet" in n for n in names) and any("gcs_server" in n for n in names), names
    assert seen, "no listening socket seen at all: the check itself is broken"
    exposed = {k: v for k, v in seen.items() if not is_loopback(k[1])}
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_kill_9_of_the_driver_ends_every_process(killed_local_run):
    assert len(killed_local_run["before"]) > 3  # driver, GCS, raylet, agents, workers
    assert not killed_local_run["left"], (
        f"alive {killed_local_run['waited_s']:.0f}s after the driver was killed: {killed_local_run['left']}")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_ray_address_fails_naming_it(monkeypatch):
    from reasonrl_fast.runtime import ray_cluster as cluster
    from reasonrl_fast.config import load_config

    monkeypatch.setattr(cluster, "RAY_CONNECT_TIMEOUT_S", 1.0)
    port = _closed_port()
    cfg = load_config(None, [f"trainer.ray_address=127.0.0.1:{port}"])
    t0 = time.monotonic()
    with pytest.raises(cluster.ClusterError, match=rf"trainer\.ray_address='127\.0\.0\.1:{port}': no Ray cluster"):
        cluster.start_ray(cfg)
    assert time.monotonic() - t0 < 10
    monkeypatch.setenv("RAY_ADDRESS", f"ray://127.0.0.1:{port}")
    with pytest.raises(cluster.ClusterError, match=r"RAY_ADDRESS='ray://127\.0\.0\.1"):
        cluster.start_ray(load_config())


def test_more_nodes_than_the_cluster_has_fails_fast():
    """trainer.nnodes=2 on a running one-node cluster: an error naming both numbers, long before
    the placement group's timeout. (Without a cluster, the run refuses before starting a local
    instance: tests/trainer/test_failures.py.)"""
    code = (
        "from reasonrl_fast.runtime.ray_cluster import ClusterError\nfrom reasonrl_fast.trainer.cluster import Cluster\n"
        "from reasonrl_fast.config import load_config\n"
        "import ray\n"
        "ray.init(address='local', num_cpus=1, include_dashboard=False, _node_ip_address='127.0.0.1', log_to_driver=False)\n"
        "try:\n"
        "    Cluster(load_config(None, ['trainer.nnodes=2', 'trainer.workers_per_node=1']), '/nonexistent')\n"
        "except ClusterError as e:\n"
        "    print('ERROR', e)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    assert "ERROR trainer.nnodes=2, but the Ray cluster has 1 alive node" in p.stdout, p.stdout + p.stderr[-3000:]
    assert time.monotonic() - t0 < 120
