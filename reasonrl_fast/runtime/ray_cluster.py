"""The Ray runtime the trainer and the eval command stand on: start or join a cluster (a local
instance listens on loopback only and is reaped if the driver dies), check that it can place
`nnodes x workers_per_node` workers, and collect one call per actor, failing as soon as one
fails with an error that names it."""

from __future__ import annotations

import os
import socket
import time
import warnings

import ray
from ray.util.placement_group import placement_group, remove_placement_group

from reasonrl_fast.errors import UserError
from reasonrl_fast.runtime import reaper

RAY_CONNECT_TIMEOUT_S = 30.0
"""How long to wait for an existing cluster's GCS port to accept a TCP connection (Ray itself
would retry for ever)."""
PLACEMENT_TIMEOUT_S = 300.0
"""How long the workers' placement group may wait for resources (autoscaling clusters)."""


class ClusterError(UserError, RuntimeError):
    """The Ray cluster cannot run this configuration: unreachable, too few nodes or resources."""


def ray_address(cfg) -> str:
    """The cluster the run joins: `trainer.ray_address`, else $RAY_ADDRESS; empty for a local
    instance."""
    return cfg.trainer.ray_address or os.environ.get("RAY_ADDRESS", "")


def check_local_nodes(cfg) -> None:
    """ClusterError when the run would start a local instance (no cluster address) but asks for
    more than one node: a local instance is one node. Cheap and without Ray, so the preflight
    runs it before the warm start, and `start_ray` before ray.init."""
    n = cfg.trainer.nnodes
    if n > 1 and not ray_address(cfg):
        raise ClusterError(f"trainer.nnodes={n}, but without trainer.ray_address or RAY_ADDRESS the run starts "
                           f"a local Ray instance, which is one node: join a multi-node cluster "
                           f"(trainer.ray_address=HOST:PORT) or set trainer.nnodes=1")


def cpu_slots(cfg) -> int:
    """The CPU slots the run's workers take on a CPU cluster: each trainer worker's
    trainer.cpus_per_worker and, in split placement, each rollout worker's `rollout_cpus`."""
    t = cfg.trainer
    slots = t.nnodes * t.workers_per_node * t.cpus_per_worker
    if t.placement == "split":
        slots += cfg.rollout.workers * cfg.rollout.tensor_parallel_size * cfg.rollout_cpus
    return slots


def oversubscribed(cfg) -> str | None:
    """A note for the log where a local CPU instance gives the workers more slots than the
    machine has cores (the roles of split placement share them), else None."""
    import torch

    cores, slots = os.cpu_count() or 1, cpu_slots(cfg)
    if ray_address(cfg) or torch.cuda.is_available() or slots <= cores:
        return None
    return (f"the workers' {slots} CPU slots over-subscribe this machine's {cores} cores: they share them "
            f"(OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'PASSIVE')} in the workers)")


QUIET_WORKER_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}
"""Set in every worker: the workers' output reaches the user's console beside the run's own
lines (log_to_driver, so that what a dying worker prints is seen), and transformers' progress
bars ("Loading weights" as each worker loads the model, one per worker) would come between
them. transformers' bars follow huggingface_hub's switch."""


def start_ray(cfg) -> bool:
    """Join `trainer.ray_address` / $RAY_ADDRESS, else start a local instance (no dashboard,
    every service on 127.0.0.1, ended with the driver). Returns True when we called ray.init
    (and so must shut it down)."""
    if ray.is_initialized():
        return False
    key = "trainer.ray_address" if cfg.trainer.ray_address else "RAY_ADDRESS"
    address = ray_address(cfg)
    check_local_nodes(cfg)
    # Workers import reasonrl_fast from the same place as the driver.
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])),
                        "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(cfg.trainer.cpus_per_worker),
                        **QUIET_WORKER_ENV}}
    if oversubscribed(cfg) and "OMP_WAIT_POLICY" not in os.environ:
        # an OpenMP thread that spins while it waits for its team takes the core another
        # worker's thread needs; passive waiting yields it (measured: RESULTS.md §21)
        env["env_vars"]["OMP_WAIT_POLICY"] = "PASSIVE"
    _no_log_dedup()
    if address:
        wait_for_gcs(address, key, RAY_CONNECT_TIMEOUT_S)
        ray.init(address=address, runtime_env=env, log_to_driver=True)
        return True
    import torch

    _loopback_only()
    global _watchdog
    _watchdog = reaper.start()
    # address="local": a new instance even where `ray start` left one running on this machine, which
    # ray.init() without an address would join (its address file, /tmp/ray/ray_current_cluster)
    # No prestarted workers: Ray starts one default worker per CPU ahead of any task, but every
    # actor here runs in the job's runtime_env (above), which those cannot serve, so each would be
    # a process started (a Python interpreter importing Ray) for nothing.
    ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", runtime_env=env,
             num_cpus=max(os.cpu_count() or 1, cpu_slots(cfg)),
             num_gpus=torch.cuda.device_count(), log_to_driver=True,
             _system_config={"enable_worker_prestart": False, "prestart_worker_first_driver": False})
    if ray.util.get_node_ip_address() != "127.0.0.1":
        warnings.warn(f"the local Ray instance runs on {ray.util.get_node_ip_address()}, not 127.0.0.1: "
                      f"its services may listen on other interfaces", stacklevel=2)
    return True


def stop_ray(owned: bool) -> None:
    """Undo `start_ray`: when `owned` (its return value), shut Ray down and let the local
    instance's watchdog go without killing anything (a clean stop). Not owned, the instance is its
    starter's (a rehearsal's two runs share one), and so is the watchdog."""
    global _watchdog
    if not owned:
        return
    ray.shutdown()
    if _watchdog is not None:
        _watchdog.stdin.close()
        _watchdog = None


_watchdog = None  # the local instance's reaper (see reaper.py): it ends Ray's processes if we die


def is_local() -> bool:
    """Whether the Ray instance in use is the local one `start_ray` started."""
    return _watchdog is not None


def _loopback_only() -> None:
    """Make the local instance listen on 127.0.0.1 only. `_node_ip_address="127.0.0.1"` alone is
    not enough: ray.init swaps a loopback address for the machine's external one unless Ray's
    "cluster mode" is off, and then its gRPC servers (GCS, raylet, object manager, core workers)
    bind every interface and the runtime-env agent the external address. With cluster mode off
    (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, the switch Ray uses on macOS and Windows) the node
    address stays loopback and every server binds it. Ray's processes read the variable when
    they import ray; this process already did, so its constant is set too."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def _no_log_dedup() -> None:
    """Print each worker's lines as they are, prefixed by the worker that printed them. Ray's
    default folds a line several workers print alike into one "[repeated Nx across cluster]" and
    appends, the first time, a notice on how to turn that off, in the middle of the run's own
    output. RAY_DEDUP_LOGS=0 is read when ray is imported, which this process already did, so
    the switch its log printer reads is set too. A RAY_DEDUP_LOGS the user set is kept."""
    if "RAY_DEDUP_LOGS" in os.environ:
        return
    os.environ["RAY_DEDUP_LOGS"] = "0"
    from ray._private import ray_logging

    ray_logging.RAY_DEDUP_LOGS = False


def wait_for_gcs(address: str, key: str, timeout_s: float) -> None:
    """Wait until `address` ("host:port" or "ray://host:port") accepts a TCP connection, at most
    `timeout_s`, then fail naming it. Other forms ("auto") are left to Ray."""
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    host = host.strip("[]")  # [::1]:6379
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=max(0.1, min(5.0, deadline - time.monotonic()))).close()
            return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"{key}={address!r}: no Ray cluster answers there (nothing accepted a connection to "
                    f"{host}:{port} within {timeout_s:g}s: {e}). Start one with `ray start --head`, or "
                    f"leave {key} empty to run a local instance") from None
            time.sleep(0.5)


def place_workers(t, bundle: dict, local: bool, world: int | None = None, nodes: int | None = None):
    """A ready placement group of `world` bundles (default `nnodes x workers_per_node`) over
    `nodes` nodes (default `nnodes`; 1: packed, on as few nodes as hold them), or an error that
    says what the cluster lacks (instead of a bare timeout)."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    nodes = nodes or t.nnodes
    if nodes > len(alive):
        hint = (" (a local instance is one node: join a multi-node cluster with trainer.ray_address "
                "or RAY_ADDRESS)" if local else "")
        raise ClusterError(f"trainer.nnodes={t.nnodes}, but the Ray cluster has {len(alive)} alive "
                           f"node(s){hint}")
    world = world or t.nnodes * t.workers_per_node
    # nnodes > 1 with one worker per node: one bundle per node (STRICT_SPREAD).
    strategy = "PACK" if nodes == 1 else ("STRICT_SPREAD" if t.workers_per_node == 1 else "SPREAD")
    pg = placement_group([dict(bundle) for _ in range(world)], strategy=strategy)
    try:
        ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        raise ClusterError(unplaceable(world, bundle, strategy, alive)) from None
    return pg


def unplaceable(world: int, bundle: dict, strategy: str, nodes: list[dict]) -> str:
    need = {k: v * world for k, v in bundle.items()}
    total: dict[str, float] = {}
    for n in nodes:
        for k in need:
            total[k] = total.get(k, 0) + n.get("Resources", {}).get(k, 0)
    missing = {k: need[k] - total[k] for k in need if need[k] > total[k]}
    per_node = {n.get("NodeManagerAddress", "?"): {k: n.get("Resources", {}).get(k, 0) for k in need}
                for n in nodes}
    why = (f"missing {missing} in the whole cluster" if missing else
           f"the cluster has enough in total, but not spread over the nodes as {strategy} needs")
    return (f"the {world} workers (trainer.nnodes x trainer.workers_per_node, {bundle} each, {strategy}) "
            f"could not be placed within {PLACEMENT_TIMEOUT_S:g}s: they need {need}; {why} "
            f"(per node: {per_node}; other jobs may hold some of it)")


PEER_DEATH_GRACE_S = 10.0
"""How long a rank's failure waits for the other ranks' calls of the same step to end, to name a
rank that died instead (`as_completed`)."""


class WorkerError(RuntimeError):
    """A worker actor died or raised; the message names it (its rank) and the call."""

    def __init__(self, message: str, rank: int | None = None, died: bool = False):
        super().__init__(message)
        self.rank, self.died = rank, died


def user_error(e: BaseException) -> UserError | None:
    """The UserError a remote call raised, when `e` (from ray.get) carries one: Ray wraps a
    worker's exception in a RayTaskError whose `cause` is the original (the class Ray makes
    also derives from it). Every driver path that reads a worker's result unwraps it through
    here, so a setting a worker finds wrong ends the run as the user's one line."""
    for err in (getattr(e, "cause", None), e):
        if isinstance(err, UserError):
            return err
    return None


def as_completed(refs: list, what: str, ranks: list[int] | None = None, role: str = "worker"):
    """(rank, result) of one call per rank, in the order they finish, failing as soon as any
    rank fails (`ranks`: the rank each call went to, by default its place in `refs`; `role`: how
    the message names the workers, "rollout worker" for split placement's engines). A plain
    ray.get on the list would wait for rank 0 first, and rank 0 may be
    blocked in a collective with the dead rank until the collective timeout runs out. A
    UserError a rank raised is raised as itself; any other failure is a WorkerError naming the
    rank (with the traceback of its cause)."""
    rank_of = {ref: r for ref, r in zip(refs, range(len(refs)) if ranks is None else ranks, strict=True)}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        r = rank_of[ready[0]]
        try:
            value = ray.get(ready[0])
        except ray.exceptions.RayActorError as e:
            raise died(r, what, role, e) from e
        except ray.exceptions.RayTaskError as e:
            mine = user_error(e)
            if mine is not None:  # a setting a worker found wrong: the user's one line
                raise mine.with_traceback(None) from None
            dead = dead_call(pending)
            if dead is not None:  # the cause, where this rank's failure is its consequence
                raise died(rank_of[dead[0]], what, role, dead[1]) from e
            raise WorkerError(f"{role} rank {r} failed during {what}: {getattr(e, 'cause', e)!r}", rank=r) from e
        yield r, value


def died(rank: int, what: str, role: str, e: BaseException) -> WorkerError:
    return WorkerError(f"{role} rank {rank} died during {what}: {str(e).splitlines()[0]}", rank=rank, died=True)


def dead_call(pending: list) -> tuple | None:
    """(ref, its RayActorError) of the first of the `pending` calls whose worker died, waiting
    up to PEER_DEATH_GRACE_S for them to end; None when none did. A rank that dies in a
    collective makes it fail on the live ranks too ("Connection reset by peer"), often before
    Ray has reported the death: the run is to name the rank that died, not the first that
    noticed."""
    if not pending:
        return None
    done, _ = ray.wait(pending, num_returns=len(pending), timeout=PEER_DEATH_GRACE_S)
    for ref in done:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as e:
            return ref, e
        except Exception:  # noqa: BLE001 - another rank's own failure: the first one is reported
            continue
    return None


def gather(refs: list, what: str, ranks: list[int] | None = None, role: str = "worker") -> list:
    """ray.get of one call per rank, in the order of `refs` (see `as_completed`)."""
    place = {r: i for i, r in enumerate(range(len(refs)) if ranks is None else ranks)}
    out: list = [None] * len(refs)
    for r, value in as_completed(refs, what, ranks, role):
        out[place[r]] = value
    return out
