"""The seccomp filter of the code sandbox (code.py, layer 10), built with libseccomp.

The launcher (`_sandbox.py`) runs with `python3 -I -S` and the standard library only, so the
filter is compiled here, once per process, with pyseccomp (a binding of the system's
libseccomp), and handed over as classic BPF bytes in the job; the launcher loads them with
prctl(PR_SET_SECCOMP) in each program and checker just before exec, after no_new_privs.

Everything is allowed except what reaches outside the sandbox's namespaces or widens the
kernel surface, which fails with EPERM:
- namespaces: unshare/clone with any CLONE_NEW* flag, setns (a user namespace would give the
  program CAP_NET_ADMIN, CAP_SYS_ADMIN over its own mounts, and much more kernel to attack);
  clone3 fails with ENOSYS, since its flags sit behind a pointer the filter cannot read (libc
  falls back to clone);
- kernel keyrings: keyctl, add_key, request_key (no namespace covers them: a session keyring
  survives fork, exec, unshare and setuid, and a uid's user keyring outlives every process);
- sockets of any family but AF_INET and AF_INET6, which the network namespace isolates: AF_UNIX
  reaches the host's pathname sockets (no namespace covers them and connect() ignores read-only
  mounts), AF_NETLINK, AF_VSOCK, AF_PACKET the kernel or the hypervisor; socketpair only as
  an AF_UNIX SOCK_STREAM or SOCK_SEQPACKET pair, an allow-list: a datagram pair can sendto()
  any socket path, and the kernel makes an AF_UNIX SOCK_RAW pair a datagram pair too;
- memfd_create: a memfd's pages are shared memory, counted against no rlimit of the process
  (RLIMIT_AS bounds mappings, not a file written through its fd), so a program could hold
  host memory far past memory_mb; nothing the sandbox runs needs one (multiprocessing's
  shared memory and semaphores use /dev/shm, a small private tmpfs there);
- the usual escape hatches: ptrace and cross-process memory or fd access, bpf,
  perf_event_open, userfaultfd, io_uring (its operations bypass seccomp: sockets, connect),
  mounts and the new mount API, file handles, modules, kexec, swap, reboot, accounting,
  quotas, the kernel log, port I/O.
A foreign system-call ABI (x32, or i386 through int 0x80) kills the process: libseccomp's
default for an architecture the filter does not name.
"""

from __future__ import annotations

import errno
import functools
import tempfile

from reasonrl_fast.errors import UserError

_AF_UNIX, _AF_INET, _AF_INET6 = 1, 2, 10
# socketpair's type: the kernel reads the low four bits as the socket type (the other bits
# may only be SOCK_CLOEXEC or SOCK_NONBLOCK, else EINVAL).
_SOCK_STREAM, _SOCK_SEQPACKET, _SOCK_TYPE_MASK = 1, 5, 0xF
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET; CLONE_NEWTIME (0x80) only for
# unshare: in clone's flags those bits are the exit signal. Flags are argument 0 of both on
# every architecture this package runs on (x86_64, aarch64).
_CLONE_NEW = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
              0x40000000)
_CLONE_NEWTIME = 0x80
_DENIED = (
    "setns", "keyctl", "add_key", "request_key",
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register",
    "mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "open_tree",
    "move_mount", "mount_setattr", "open_by_handle_at", "name_to_handle_at",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "swapon", "swapoff", "reboot", "acct", "quotactl", "syslog", "iopl", "ioperm",
    "lookup_dcookie", "memfd_create", "memfd_secret",
)


def _seccomp():
    """pyseccomp, or a UserError saying what to install (it needs the system's libseccomp)."""
    try:
        import pyseccomp
    except ImportError:
        raise UserError("code rewards need the pyseccomp package for their sandbox's seccomp "
                        "filter: pip install 'reasonrl_fast[train]' (or pyseccomp)") from None
    except (OSError, RuntimeError) as e:  # pyseccomp could not find or load libseccomp.so.2
        raise UserError(f"code rewards need the system library libseccomp for their sandbox's "
                        f"seccomp filter ({e}): install the libseccomp2 package "
                        f"(apt-get install libseccomp2; dnf install libseccomp)") from None
    return pyseccomp


@functools.lru_cache(maxsize=1)
def filter_bpf() -> bytes:
    """The filter as classic BPF (struct sock_filter[]) for this machine's architecture."""
    sc = _seccomp()
    eperm = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    for name in _DENIED:
        if sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0:  # absent on this architecture
            f.add_rule(eperm, name)
    for flag in _CLONE_NEW:
        f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for flag in _CLONE_NEW + (_CLONE_NEWTIME,):
        f.add_rule(eperm, "unshare", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    # socket(): AF_INET and AF_INET6 only. One rule cannot compare an argument twice, so the
    # rest is covered as < AF_INET, > AF_INET6 and each family between them. The comparisons
    # see all 64 bits: a family with high bits set (the kernel reads only the low 32) is > 10.
    f.add_rule(eperm, "socket", sc.Arg(0, sc.LT, _AF_INET))
    f.add_rule(eperm, "socket", sc.Arg(0, sc.GT, _AF_INET6))
    for family in range(_AF_INET + 1, _AF_INET6):
        f.add_rule(eperm, "socket", sc.Arg(0, sc.EQ, family))
    # socketpair(): AF_UNIX stream or seqpacket only. The filter cannot say "type not in"
    # with a mask, so every other value of the type's four bits is refused, one rule each.
    f.add_rule(eperm, "socketpair", sc.Arg(0, sc.NE, _AF_UNIX))
    for kind in range(_SOCK_TYPE_MASK + 1):
        if kind not in (_SOCK_STREAM, _SOCK_SEQPACKET):
            f.add_rule(eperm, "socketpair", sc.Arg(1, sc.MASKED_EQ, _SOCK_TYPE_MASK, kind))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


@functools.lru_cache(maxsize=None)
def syscall_number(name: str) -> int:
    """This architecture's number of a system call (the launcher calls keyctl by number)."""
    sc = _seccomp()
    return sc.resolve_syscall(sc.Arch.NATIVE, name)
