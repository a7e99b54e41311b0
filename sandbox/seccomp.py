"""The seccomp profile of every container pid starts: Docker's default rules, and only the socket families a sandbox
needs.

Why pid's own: Docker's default profile (engine 20.10, at least) lets a container make a socket of any family its
kernel has, and with `--network none` an AF_VSOCK socket still reached the hypervisor (a connect to the host was
answered). A profile given to the engine replaces its default whole, so this one carries the default's rules too:
the system calls moby's profiles/seccomp/default.json allows every container (as of 2025), with its conditional
rules settled for pid's containers, whose capabilities unlock none of them. One is left out on purpose:
open_by_handle_at, which the default allows with CAP_DAC_READ_SEARCH. pid's machinery has that capability (for git),
and a root agent shares it; with it, open_by_handle_at opens files by inode number anywhere on a mount's filesystem,
past the container's own view ("shocker"), and neither needs it.

Socket families (socket's first argument; socketpair makes only AF_UNIX pairs):
  AF_UNIX     local sockets between the sandbox's own processes
  AF_INET, AF_INET6
              the network the job's `--network` gives (with "none", the loopback interface alone)
  AF_NETLINK  the container's own network namespace: glibc's getaddrinfo asks it which addresses exist, `ip` and
              `ss` list interfaces and sockets through it
Any other family (AF_VSOCK, AF_PACKET, AF_BLUETOOTH, AF_ALG, ...) fails with EAFNOSUPPORT, as on a kernel built
without it.

Unlike Docker's, the profile has no 32-bit x86 ABI: a 32-bit x86 program is killed at its first system call (SIGSYS,
"Bad system call"). That ABI makes sockets through socketcall(2), whose arguments are in memory, out of seccomp's
sight, and libseccomp turns every rule on socket() into one on socketcall(SYS_SOCKET) that ignores the family: with
it, any family would be one 32-bit program away (Docker's own AF_VSOCK rule has that hole). 64-bit x86, x32, arm64
and 32-bit arm (which has no socketcall) keep working.

Under gVisor (runsc) the engine's profile is not applied (its kernel is in user space, and runsc ignores the OCI
seccomp section unless started with --oci-seccomp); its kernel has no AF_VSOCK for the sandbox (EAFNOSUPPORT).
"""
from __future__ import annotations

import errno
import json
from typing import Any, Iterable

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCKET_FAMILIES = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)

# Docker's default allowlist (moby profiles/seccomp/default.json), but socket and socketpair (filtered by family in
# profile()) and socketcall (32-bit x86's, see above).
ALLOWED = """
accept accept4 access adjtimex alarm bind brk cachestat capget capset chdir chmod chown chown32 clock_adjtime
clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64 clock_nanosleep clock_nanosleep_time64
close close_range connect copy_file_range creat dup dup2 dup3 epoll_create epoll_create1 epoll_ctl epoll_ctl_old
epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd eventfd2 execve execveat exit exit_group faccessat
faccessat2 fadvise64 fadvise64_64 fallocate fanotify_mark fchdir fchmod fchmodat fchmodat2 fchown fchown32 fchownat
fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstat64 fstatat64 fstatfs
fstatfs64 fsync ftruncate ftruncate64 futex futex_requeue futex_time64 futex_wait futex_waitv futex_wake futimesat
getcpu getcwd getdents getdents64 getegid getegid32 geteuid geteuid32 getgid getgid32 getgroups getgroups32
getitimer getpeername getpgid getpgrp getpid getppid getpriority getrandom getresgid getresgid32 getresuid
getresuid32 getrlimit get_robust_list getrusage getsid getsockname getsockopt get_thread_area gettid gettimeofday
getuid getuid32 getxattr getxattrat inotify_add_watch inotify_init inotify_init1 inotify_rm_watch io_cancel ioctl
io_destroy io_getevents io_pgetevents io_pgetevents_time64 ioprio_get ioprio_set io_setup io_submit ipc kill
landlock_add_rule landlock_create_ruleset landlock_restrict_self lchown lchown32 lgetxattr link linkat listen
listmount listxattr listxattrat llistxattr _llseek lremovexattr lseek lsetxattr lstat lstat64 madvise
map_shadow_stack membarrier memfd_create memfd_secret mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall mmap
mmap2 mprotect mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedreceive_time64 mq_timedsend
mq_timedsend_time64 mq_unlink mremap mseal msgctl msgget msgrcv msgsnd msync munlock munlockall munmap
name_to_handle_at nanosleep newfstatat _newselect open openat openat2 pause pidfd_open pidfd_send_signal pipe pipe2
pkey_alloc pkey_free pkey_mprotect poll ppoll ppoll_time64 prctl pread64 preadv preadv2 prlimit64 process_mrelease
pselect6 pselect6_time64 pwrite64 pwritev pwritev2 read readahead readlink readlinkat readv recv recvfrom recvmmsg
recvmmsg_time64 recvmsg remap_file_pages removexattr removexattrat rename renameat renameat2 restart_syscall
riscv_hwprobe rmdir rseq rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend
rt_sigtimedwait rt_sigtimedwait_time64 rt_tgsigqueueinfo sched_getaffinity sched_getattr sched_getparam
sched_get_priority_max sched_get_priority_min sched_getscheduler sched_rr_get_interval sched_rr_get_interval_time64
sched_setaffinity sched_setattr sched_setparam sched_setscheduler sched_yield seccomp select semctl semget semop
semtimedop semtimedop_time64 send sendfile sendfile64 sendmmsg sendmsg sendto setfsgid setfsgid32 setfsuid
setfsuid32 setgid setgid32 setgroups setgroups32 setitimer setpgid setpriority setregid setregid32 setresgid
setresgid32 setresuid setresuid32 setreuid setreuid32 setrlimit set_robust_list setsid setsockopt set_thread_area
set_tid_address setuid setuid32 setxattr setxattrat shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4
sigprocmask sigreturn splice stat stat64 statfs statfs64 statmount statx symlink symlinkat sync sync_file_range
syncfs sysinfo tee tgkill time timer_create timer_delete timer_getoverrun timer_gettime timer_gettime64
timer_settime timer_settime64 timerfd_create timerfd_gettime timerfd_gettime64 timerfd_settime timerfd_settime64
times tkill truncate truncate64 ugetrlimit umask uname unlink unlinkat uretprobe utime utimensat utimensat_time64
utimes vfork vmsplice wait4 waitid waitpid write writev
process_vm_readv process_vm_writev ptrace
""".split()
# (Docker allows the last three from Linux 4.8, which stopped ptrace from getting past seccomp; older kernels are
# not supported.)


def _arg(value: int, op: str) -> dict[str, Any]:
    return {"index": 0, "value": value, "op": op}


def _allow(name: str, *args: dict[str, Any], arches: Iterable[str] = (), not_on: Iterable[str] = ()) -> dict[str, Any]:
    """A rule; `arches`, `not_on`: on engines of (not of) these architectures only (Go's names)."""
    rule: dict[str, Any] = {"names": [name], "action": "SCMP_ACT_ALLOW", "args": list(args)}
    if arches:
        rule["includes"] = {"arches": list(arches)}
    if not_on:
        rule["excludes"] = {"arches": list(not_on)}
    return rule


def _first_argument_in(name: str, allowed: Iterable[int]) -> list[dict[str, Any]]:
    """`name` allowed when its first argument is one of `allowed` (exactly: a value with any high bit set matches
    none), else EAFNOSUPPORT. A seccomp rule compares an argument with one value, so the values refused are ruled
    out below, between and above the allowed ones (anything a rule misses gets the profile's EPERM)."""
    values = sorted(set(allowed))
    refused = [_arg(values[0], "SCMP_CMP_LT"), _arg(values[-1], "SCMP_CMP_GT")]
    refused += [_arg(value, "SCMP_CMP_EQ") for value in range(values[0], values[-1]) if value not in values]
    return ([_allow(name, _arg(value, "SCMP_CMP_EQ")) for value in values]
            + [{"names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EAFNOSUPPORT, "args": [arg]}
               for arg in refused])


def profile() -> dict[str, Any]:
    """The profile, in the form the engine takes (`--security-opt seccomp=<json>`)."""
    # clone's flags refused: CLONE_NEW* (as in Docker's, a new namespace needs CAP_SYS_ADMIN) and CLONE_PARENT, which
    # Docker's allows: a child so made is its parent's sibling, and a command's shell's sibling would be a child of
    # pid's root drop (drop.c, serve), which reaps only the shells it made: each such child, once dead, would hold a
    # place in the process table for the container's life
    refused = 0x7E020000 | 0x00008000
    rules: list[dict[str, Any]] = [{"names": ALLOWED, "action": "SCMP_ACT_ALLOW", "args": []}]
    rules += [_allow("personality", _arg(persona, "SCMP_CMP_EQ"))   # Linux, 32-bit, uname 2.6, both; asking
              for persona in (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)]
    rules += [_allow("arch_prctl", arches=["amd64", "x32"]), _allow("modify_ldt", arches=["amd64", "x32", "x86"]),
              *(_allow(name, arches=["arm", "arm64"]) for name in
                ("arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint", "cacheflush", "set_tls"))]
    rules += [_allow("clone", {"index": index, "value": refused, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"},
                     **{key: ["s390", "s390x"]})   # (s390's clone takes its flags second)
              for index, key in ((0, "not_on"), (1, "arches"))]
    rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS, "args": []})   # (its
    # flags are in memory: ENOSYS makes the C library fall back to clone)
    rules += _first_argument_in("socket", SOCKET_FAMILIES)
    rules += _first_argument_in("socketpair", [AF_UNIX])
    return {"defaultAction": "SCMP_ACT_ERRNO",   # EPERM
            "archMap": [{"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X32"]},   # (no X86)
                        {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]}],
            "syscalls": rules}


SECURITY_OPT = ["no-new-privileges", "seccomp=" + json.dumps(profile(), separators=(",", ":"))]
