"""The sandbox's seccomp filter: the system calls a confined program may not make (imports nothing from llmx; the
sandbox's child imports it by path before it confines itself).

Refused with EPERM: the kernel keyrings (``keyctl``, ``add_key``, ``request_key``: a process reaches its caller's
session keyring whatever its uid), new namespaces (``unshare``, ``setns``, ``clone`` with a namespace flag: a user
namespace of its own would hold capabilities, and kernel surface such as nf_tables with them), mounts of every kind,
``ptrace`` and cross-process memory access, ``bpf``, ``perf_event_open``, ``userfaultfd``, io_uring, file handles,
modules, ``kexec``, ``chroot``, ``syslog``, ``acct``, ``swapon``, ``quotactl``; memory the address-space limit does
not count (``memfd_create``, ``memfd_secret``, SysV shared memory, message queues and semaphores); sockets of any
family but IPv4 and IPv6 (a Unix socket file in a read-only folder still accepts connections; vsock and netlink are
not split by the network namespace), and datagram socket pairs (which can be pointed at any Unix socket); stream
socket pairs stay, for ``multiprocessing``. A number newer than the filter knows answers ENOSYS. ``clone3`` answers
ENOSYS, so the C library falls back to ``clone``, whose flags the filter can read. Other architectures' system calls
(x32, i386) kill the process. Tables for x86_64 and aarch64; elsewhere the sandbox cannot confine.
"""

import ctypes
import errno

DENIED = ("keyctl", "add_key", "request_key", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
          "ptrace", "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open", "userfaultfd",
          "io_uring_setup", "io_uring_enter", "io_uring_register", "open_by_handle_at", "name_to_handle_at",
          "init_module", "finit_module", "kexec_load", "syslog", "acct", "swapon", "quotactl", "memfd_create",
          "shmget", "msgget", "semget", "memfd_secret", "open_tree", "open_tree_attr", "move_mount", "fsopen",
          "fsmount", "fspick", "mount_setattr")
NEW_SYSCALLS = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
                "move_mount": 429, "fsopen": 430, "fsmount": 432, "fspick": 433, "clone3": 435, "mount_setattr": 442,
                "memfd_secret": 447, "open_tree_attr": 467}
NEWEST = 467  # a number above it (a later kernel's call) answers ENOSYS, which the C library falls back from
TABLES = {  # machine: (AUDIT_ARCH_*, system call numbers)
    "x86_64": (0xC000003E, {
        "keyctl": 250, "add_key": 248, "request_key": 249, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "open_by_handle_at": 304, "name_to_handle_at": 303,
        "init_module": 175, "finit_module": 313, "kexec_load": 246, "syslog": 103, "acct": 163, "swapon": 167,
        "quotactl": 179, "memfd_create": 319, "shmget": 29, "msgget": 68, "semget": 64, "clone": 56, "socket": 41,
        "socketpair": 53, **NEW_SYSCALLS}),
    "aarch64": (0xC00000B7, {
        "keyctl": 219, "add_key": 217, "request_key": 218, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "open_by_handle_at": 265, "name_to_handle_at": 264,
        "init_module": 105, "finit_module": 273, "kexec_load": 104, "syslog": 116, "acct": 89, "swapon": 224,
        "quotactl": 60, "memfd_create": 279, "shmget": 194, "msgget": 186, "semget": 190, "clone": 220,
        "socket": 198, "socketpair": 199, **NEW_SYSCALLS}),
}
NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
AF_INET, AF_INET6, SOCK_DGRAM, SOCK_TYPE_MASK, X32_BIT = 2, 10, 2, 0xF, 0x40000000
LD_W_ABS, JEQ, JGE, JSET, AND, RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
ALLOW, KILL_PROCESS, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
NR, ARCH, ARG0 = 0, 4, 16  # offsets in struct seccomp_data (the low half of args[0]: little-endian machines)


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter for ``machine`` (``os.uname().machine``); OSError where there is no table."""
    if machine not in TABLES:
        raise OSError(errno.ENOSYS, f"no system-call table for {machine}")
    arch, nr = TABLES[machine]
    eperm = ERRNO | errno.EPERM
    out = [(LD_W_ABS, 0, 0, ARCH), (JEQ, 1, 0, arch), (RET, 0, 0, KILL_PROCESS), (LD_W_ABS, 0, 0, NR)]
    if machine == "x86_64":
        out += [(JGE, 0, 1, X32_BIT), (RET, 0, 0, KILL_PROCESS)]
    for name in DENIED:
        out += [(JEQ, 0, 1, nr[name]), (RET, 0, 0, eperm)]
    out += [(JEQ, 0, 1, nr["clone3"]), (RET, 0, 0, ERRNO | errno.ENOSYS)]
    out += [(JGE, 0, 1, NEWEST + 1), (RET, 0, 0, ERRNO | errno.ENOSYS)]
    out += [(JEQ, 0, 5, nr["socket"]), (LD_W_ABS, 0, 0, ARG0), (JEQ, 2, 0, AF_INET), (JEQ, 1, 0, AF_INET6),
            (RET, 0, 0, eperm), (RET, 0, 0, ALLOW)]
    out += [(JEQ, 0, 5, nr["socketpair"]), (LD_W_ABS, 0, 0, ARG0 + 8), (AND, 0, 0, SOCK_TYPE_MASK),
            (JEQ, 0, 1, SOCK_DGRAM), (RET, 0, 0, eperm), (RET, 0, 0, ALLOW)]
    out += [(JEQ, 0, 4, nr["clone"]), (LD_W_ABS, 0, 0, ARG0), (JSET, 0, 1, NAMESPACE_FLAGS), (RET, 0, 0, eperm),
            (RET, 0, 0, ALLOW)]
    return out + [(RET, 0, 0, ALLOW)]


def install(libc, machine: str) -> None:
    """Load the filter into this thread (and every process it starts); needs no-new-privileges first."""
    rules = program(machine)
    filters = (SockFilter * len(rules))(*[SockFilter(*r) for r in rules])
    prog = SockFprog(len(rules), filters)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"seccomp filter: {errno.errorcode.get(e, e)}")
