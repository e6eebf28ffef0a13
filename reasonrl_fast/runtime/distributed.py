"""The process group of a set of Ray actors (the trainer's workers, eval's tensor-parallel
engines): rank 0's rendezvous socket, then torch.distributed's default group over a TCPStore
that socket serves."""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket

import torch
import torch.distributed as dist


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return host == "localhost"


def rendezvous_socket(host: str) -> socket.socket:
    """Rank 0's listening socket for the TCPStore. On a loopback node (a local run) it is bound
    to that address and kept open for the store, which then listens nowhere else (and no other
    process can take the port in between). Otherwise it is bound on every interface, as the
    other nodes must reach it."""
    local = _is_loopback(host)
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.bind((host if local else "", 0))
    if local:
        s.listen(128)
    return s


def rendezvous_address(owner) -> tuple[str, int]:
    """Rank 0's address and a port for the process group's rendezvous, from inside the Ray actor
    `owner`, which keeps the listening socket (`owner._listen`) for `init_process_group`."""
    import ray

    host = ray.util.get_node_ip_address()
    owner._listen = rendezvous_socket(host)
    return host, owner._listen.getsockname()[1]


def loopback_store(host: str, port: int, rank: int, world: int, timeout: datetime.timedelta,
                   listen: socket.socket | None) -> dist.TCPStore | None:
    """On a loopback run: the rendezvous store on rank 0's `listen` socket (from
    `rendezvous_socket`, so no other process can take the port between its choice and its use),
    with gloo's and NCCL's bootstrap sockets pinned to the loopback interface (by default they bind
    the address the host name resolves to, often an external one). Elsewhere None: the caller's
    store binds the port itself, on every interface (multi-node), and `listen` is closed."""
    if not _is_loopback(host):
        if listen is not None:
            listen.close()
        return None
    lo = next((name for _, name in socket.if_nameindex() if name == "lo"), None)
    if lo:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)
    fd = listen.detach() if rank == 0 and listen is not None else None  # the store owns it now
    return dist.TCPStore(host, port, world, rank == 0, timeout, master_listen_fd=fd)


def init_process_group(rank: int, world: int, master_addr: str, master_port: int,
                       timeout_s: float = 1800, listen: socket.socket | None = None) -> torch.device:
    """The default process group of `world` Ray actors, nccl on GPU, gloo on CPU; returns this
    rank's device. A collective that waits longer than `timeout_s` for another rank (dead or
    stuck) fails instead of hanging. `listen`: rank 0's socket from `rendezvous_socket`. It
    leaves RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment, as torchrun does
    (vLLM's `external_launcher` reads them)."""
    os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port),
                      RANK=str(rank), WORLD_SIZE=str(world))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = loopback_store(master_addr, master_port, rank, world, timeout, listen)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=world,
                            timeout=timeout)
    return device
