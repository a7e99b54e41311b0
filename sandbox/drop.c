/* pid's privilege drop, run as root by the exec server (channel.sh) for every command of the agent:

       /.pid/drop UID GID /absolute/program [ARGS...]
       /.pid/drop UID GID -s [-z LIBRARY] /absolute/program [ARGS...]      (serve: the slot shells' starter)

   It empties the capability bounding set, then takes UID and GID with no supplementary groups, clears the ambient
   and inheritable capabilities (a uid change from root clears the permitted and effective ones), and executes the
   program as is (no PATH search). The container's no-new-privileges keeps set-uid binaries from bringing any back.
   What `setpriv --reuid --regid --clear-groups --inh-caps=-all --bounding-set=-all` does, without a C library:
   a few system calls, so a command's start costs ~1 ms less CPU in the container than through setpriv. Each step
   is checked, and what it left is read back (the bounding set, the capability sets): any failure ends it before the
   program runs, 126 (a step refused or not done), 127 (bad arguments, or the exec failed).

   Serve (-s): the bash server's pre-started slot shells are forked from this small process, not from the server.
   A fork copies the forking process's page tables, and each page either side writes next is copied again: from
   the server that was ~170 page faults per command (its heap, then the child's until its exec), the most of its
   CPU on a VM where a fault costs microseconds. Requests come on stdin from the root server alone, a line each:
       s <fifo> <output>   -> a child, in a process group of its own: stdin /dev/null, stdout and stderr <output>
                              (made now, as root, with the server's umask; exit 1 when it cannot be), fd 3 <fifo>
                              read-only (opened as root); then the drop and the program. (The bounding set is
                              emptied once, as serve starts: each child has it so.) Reply: its pid, or
                              -<errno> when the fork failed (the process table is full).
       w <pid>             -> what bash's `wait` gives for that child: its status once it ended (then it is reaped:
                              until then its number stays taken), 128 + the signal that killed or stopped it, 127
                              when it is no child of this one.
   Each reply is 16 bytes, the number then spaces and "\n" (the server reads it in one read); s's gives the shell's
   parent after it. At EOF it ends; a request it cannot read ends it too (127), and the server then quits.

   The zygote (-s -z LIBRARY): an exec of bash costs the container ~1.2 ms of CPU (the loader, its relocations,
   glibc's CPU probe, which traps to a VM's hypervisor, bash's start, the locale); a fork of a bash that did all that
   costs ~0.3. So the drop starts one such bash as the agent, with `z LIBRARY` after the program's arguments: the slot
   shell's script loads this file's other half into it as a builtin (`enable -f`, built with -DPID_ZYGOTE), which
   never returns in the zygote: it forks a slot shell for each s, from its state before any command (no command of
   the agent's ever runs in it), with the descriptors the drop opened as root and sent along (SCM_RIGHTS), and waits
   for them on w. Each shell is then what a fresh exec would be: its own $$, process group and signal state, and
   the script reseeds RANDOM and restarts SECONDS; it reads its FIFO only once the drop has its number. The agent
   cannot ptrace the zygote nor open its memory, from its exec on (it is not dumpable: see zstart); it can signal it
   and set its limits and priority (the same uid's), which reach its own later shells only. A zygote that ends or
   stops is killed (the drop waits on a signalfd for that beside its answer), its shells die with it (their
   parent-death signal, kept in what they exec: w then says 128 + SIGKILL), and the next s starts another; one whose
   fork fails is ended too (its limits may be the agent's); one that exits before its first answer (a bash that
   cannot load the builtin) is not tried again. A shell the zygote could not give, the drop forks itself.

   Built by the host (sandbox/drop_helper.py: cc -static -nostdlib; the builtin cc -shared -DPID_ZYGOTE) and put
   read-only into /.pid, root's. */
#include <linux/capability.h>
#include <linux/prctl.h>
#include <asm/unistd.h>
#include <linux/fcntl.h>
#include <linux/wait.h>
#include <asm/signal.h>
#include <linux/poll.h>

/* Every call passes five arguments (the unused ones 0): prctl's ambient and bounding-set operations refuse
   anything but zeros in the arguments they do not use. */
#if defined(__x86_64__)
static long sys4(long n, long a, long b, long c, long d) {
    long r;
    register long r10 __asm__("r10") = d, r8 __asm__("r8") = 0;
    __asm__ volatile ("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                      : "rcx", "r11", "memory");
    return r;
}
#ifndef PID_ZYGOTE
__asm__(".globl _start\n_start:\n mov %rsp, %rdi\n and $-16, %rsp\n call start\n hlt\n");
#endif
#elif defined(__aarch64__)
static long sys4(long n, long a, long b, long c, long d) {
    register long x8 __asm__("x8") = n, x0 __asm__("x0") = a, x1 __asm__("x1") = b, x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d, x4 __asm__("x4") = 0;
    __asm__ volatile ("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
    return x0;
}
#ifndef PID_ZYGOTE
__asm__(".globl _start\n_start:\n mov x0, sp\n bl start\n brk #0\n");
#endif
#else
#error "pid's drop helper knows x86_64 and aarch64 (elsewhere pid uses setpriv)"
#endif
#define sys(n, a, b, c) sys4(n, a, b, c, 0)
#ifndef __NR_close_range
#define __NR_close_range 436   /* (x86_64's and aarch64's; headers older than Linux 5.9 lack it) */
#endif

static void leave(long code) {
    for (;;) sys(__NR_exit_group, code, 0, 0);
}

static void put(long fd, long at) {   /* fd onto descriptor `at` (nothing to do when it is there already) */
    if (fd < 0) leave(1);
    if (fd != at && (sys(__NR_dup3, fd, at, 0) != at || sys(__NR_close, fd, 0, 0))) leave(126);
}

static long waited(long pid, int *st) {   /* wait4 for one child, ended or stopped */
    long r;
    do r = sys4(__NR_wait4, pid, (long)st, WUNTRACED, 0); while (r == -4);   /* (EINTR) */
    return r;
}

/* --- the zygote's socket: 16-byte requests ("s" with three descriptors, "w" and a pid), 8-byte answers ---------- */
#define AF_UNIX 1
#define SOCK_SEQPACKET 5
#define SOL_SOCKET 1
#define SCM_RIGHTS 1
#define MSG_NOSIGNAL 0x4000
#define MSG_CMSG_CLOEXEC 0x40000000
#define THREE_FDS (16 + 3 * 4)   /* a control message's length with three descriptors */
struct iov { void *base; unsigned long len; };
struct msg { void *name; long namelen; struct iov *iov; unsigned long iovlen; void *control; unsigned long controllen;
             long flags; };
struct fds { unsigned long len; int level, type; int fd[3], pad; };
union request { char op[16]; long word[2]; };

#ifndef PID_ZYGOTE
/* --- the drop ----------------------------------------------------------------------------------------------------- */
static long code(int st) {   /* bash's wait: the exit code, or 128 + the signal that ended or stopped it */
    if ((st & 0x7f) == 0) return (st >> 8) & 0xff;
    if ((st & 0xff) == 0x7f) return 128 + ((st >> 8) & 0xff);
    return 128 + (st & 0x7f);
}

static long number(const char *s) {   /* a decimal id, or -1 */
    long v = 0;
    if (!*s) return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > 0x7fffffffL / 10) return -1;
        v = v * 10 + (*s - '0');
    }
    return v;
}

static void unbound(void) {   /* the bounding set emptied: no exec can bring a capability back */
    long last = 0;   /* the kernel's capabilities: EINVAL beyond the last (every kernel pid runs on has > 33) */
    for (; last < 64; last++) {
        long r = sys(__NR_prctl, PR_CAPBSET_DROP, last, 0);
        if (r == -22 && last > 33) break;
        if (r) leave(126);
    }
    for (long cap = 0; cap < last; cap++)
        if (sys(__NR_prctl, PR_CAPBSET_READ, cap, 0) != 0) leave(126);
}

static void become(long uid, long gid, long egid) {   /* the agent's ids, and no capability left: returns only when
    checked (egid: the zygote's differs from gid until its bash starts: see zstart) */
    if (sys(__NR_setgroups, 0, 0, 0) || sys(__NR_setresgid, gid, egid, egid) || sys(__NR_setresuid, uid, uid, uid))
        leave(126);
    if (sys(__NR_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0) != 0 &&
        sys(__NR_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, 0) != -22)   /* (a kernel without ambient ones) */
        leave(126);
    struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct caps[2] = {{0, 0, 0}, {0, 0, 0}};
    if (sys(__NR_capset, (long)&head, (long)caps, 0) || sys(__NR_capget, (long)&head, (long)caps, 0))
        leave(126);
    for (int i = 0; i < 2; i++)
        if (caps[i].effective || caps[i].permitted || caps[i].inheritable) leave(126);
}

/* --- serve ------------------------------------------------------------------------------------------------------ */
static void reply(long v, long parent) {   /* a 16-byte reply: the number (and a parent), spaces, "\n" */
    char r[16], d[20];
    int i = 0;
    for (int k = 0; k < 2 && (k == 0 || parent > 0); k++) {
        long w = k ? parent : v;
        unsigned long u = w < 0 ? -w : w;
        int n = 0;
        if (k) r[i++] = ' ';
        if (w < 0) r[i++] = '-';
        do d[n++] = (char)('0' + u % 10); while ((u /= 10) && n < 7);   /* (pids have at most 7 digits) */
        while (n) r[i++] = d[--n];
    }
    while (i < 15) r[i++] = ' ';
    r[15] = '\n';
    if (sys(__NR_write, 1, (long)r, 16) != 16) leave(0);   /* the server is gone */
}

static void unblock(void) {   /* (the drop blocks SIGCHLD for its signalfd; a mask outlives an exec) */
    unsigned long none = 0;
    if (sys4(__NR_rt_sigprocmask, SIG_SETMASK, (long)&none, 0, 8)) leave(126);
}

static long spawn(const char *fifo, const char *out, long uid, long gid, char **argv, char **envp) {
    long pid = sys(__NR_clone, SIGCHLD, 0, 0);   /* a fork (x86_64's and aarch64's clone: flags, then zeros) */
    if (pid > 0) sys(__NR_setpgid, pid, pid, 0);   /* (both sides, as a shell does: the group is there on return) */
    if (pid) return pid;
    unblock();
    if (sys(__NR_setpgid, 0, 0, 0)) leave(126);
    put(sys(__NR_openat, AT_FDCWD, (long)fifo, O_RDONLY), 3);   /* (a link of /proc: the server's FIFO) */
    put(sys(__NR_openat, AT_FDCWD, (long)"/dev/null", O_RDONLY), 0);
    long fd = sys4(__NR_openat, AT_FDCWD, (long)out, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0666);
    if (fd < 0 || sys(__NR_dup3, fd, 2, 0) != 2) leave(1);
    put(fd, 1);
    become(uid, gid, gid);   /* (the bounding set went once, in serve: a fork keeps it) */
    sys(__NR_execve, (long)argv[0], (long)argv, (long)envp);
    leave(127);
    return 0;
}

static long zsend(long sock, char op, long arg, const int *fd) {   /* 16 when sent */
    union request q = {{op}};
    q.word[1] = arg;
    struct iov v = {&q, 16};
    struct fds c = {THREE_FDS, SOL_SOCKET, SCM_RIGHTS, {fd ? fd[0] : 0, fd ? fd[1] : 0, fd ? fd[2] : 0}, 0};
    struct msg m = {0, 0, &v, 1, fd ? &c : 0, fd ? sizeof c : 0, 0};
    return sys(__NR_sendmsg, sock, (long)&m, MSG_NOSIGNAL);
}

/* --- the zygote, the drop's side (see the top) ------------------------------------------------------------------ */
#define KIDS 16
static struct {
    long pid, sock, sigs, gen;   /* up (pid > 0), the drop's end of its socket, a signalfd for SIGCHLD, restarts */
    int broken, answered;        /* (broken: it ended before its first answer, or cannot be had: not tried again) */
    long kid[KIDS], kidgen[KIDS];   /* its shells not yet waited for, and which zygote forked each */
    char *argv[24];
} z;

static void zstart(long uid, long gid, char **envp) {
    /* Its effective gid differs from its real one as it executes bash: the kernel then makes it not dumpable from
       the exec on (no moment in which the agent could open its memory or trace it); bash, seeing the two differ,
       sets them to the real one as it starts (its "privileged mode" off; each shell sets all three), and it stays
       not dumpable. */
    int sv[2];
    if (sys4(__NR_socketpair, AF_UNIX, SOCK_SEQPACKET | O_CLOEXEC, 0, (long)sv)) return;
    long pid = sys(__NR_clone, SIGCHLD, 0, 0);
    if (pid == 0) {
        unblock();
        if (sys(__NR_setpgid, 0, 0, 0) || sv[1] <= 3) leave(126);   /* (the signalfd holds 3: see serve) */
        long null = sys(__NR_openat, AT_FDCWD, (long)"/dev/null", O_RDWR);
        for (long fd = 0; fd < 3; fd++)
            if (null < 0 || (null != fd && sys(__NR_dup3, null, fd, 0) != fd)) leave(126);
        if (null > 2) sys(__NR_close, null, 0, 0);
        put(sv[1], 3);
        become(uid, gid, gid == 65534 ? 65533 : 65534);
        sys(__NR_execve, (long)z.argv[0], (long)z.argv, (long)envp);
        leave(127);
    }
    sys(__NR_close, sv[1], 0, 0);
    if (pid < 0) {   /* (the process table is full: another try at the next shell) */
        sys(__NR_close, sv[0], 0, 0);
        return;
    }
    sys(__NR_setpgid, pid, pid, 0);
    z.pid = pid, z.sock = sv[0], z.answered = 0, z.gen++;
}

static void zdown(void) {   /* it ended or stopped: killed and reaped (it is not reaped before: no number reused) */
    int st = 0;
    sys(__NR_kill, z.pid, 9, 0);
    while (sys4(__NR_wait4, z.pid, (long)&st, 0, 0) == -4) {}
    sys(__NR_close, z.sock, 0, 0);
    z.broken |= !z.answered && (st & 0x7f) == 0;   /* it exited before its first answer (no builtin): not killed */
    z.pid = 0;
}

static int zanswer(long *value) {   /* 1: its answer; 0: it ended or stopped first (and is now down) */
    for (;;) {
        struct pollfd p[2] = {{(int)z.sock, POLLIN, 0}, {(int)z.sigs, POLLIN, 0}};
        long r = sys4(__NR_ppoll, (long)p, 2, 0, 0);
        if (r == -4) continue;
        if (r < 0) break;
        if (p[0].revents & POLLIN) {
            if (sys(__NR_read, z.sock, (long)value, 8) != 8) break;
            z.answered = 1;
            return 1;
        }
        if (p[0].revents) break;   /* hung up: it ended */
        char drained[512];
        int info[32];   /* (a siginfo: si_pid is its fifth int) */
        while (sys(__NR_read, z.sigs, (long)drained, sizeof drained) > 0) {}
        info[4] = 0;
        if (sys4(__NR_waitid, P_PID, z.pid, (long)info, WEXITED | WSTOPPED | WNOHANG | WNOWAIT) == 0 &&
            info[4] == z.pid)
            break;   /* ended or stopped (some other child's SIGCHLD woke it otherwise) */
    }
    zdown();
    return 0;
}

static void zforget(long pid) {   /* a number now another shell's: no entry of an earlier one may answer for it */
    for (int i = 0; i < KIDS; i++)
        if (z.kid[i] == pid) z.kid[i] = 0;
}

static long zspawn(const char *fifo, const char *out, long uid, long gid, char **envp) {
    /* a slot shell forked by the zygote; 0: none (no zygote, it went, its fork failed, or its table is full): the
       drop forks it itself. (A zygote whose fork fails goes too: the agent may have lowered its limits.) */
    int i = 0, fd[3];
    while (i < KIDS && z.kid[i]) i++;
    if (z.broken || i == KIDS) return 0;
    if (!z.pid) zstart(uid, gid, envp);
    if (!z.pid) return 0;
    fd[0] = (int)sys(__NR_openat, AT_FDCWD, (long)fifo, O_RDONLY | O_CLOEXEC);
    fd[1] = (int)sys(__NR_openat, AT_FDCWD, (long)"/dev/null", O_RDONLY | O_CLOEXEC);
    fd[2] = (int)sys4(__NR_openat, AT_FDCWD, (long)out, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0666);
    long pid = 0;
    if (fd[0] >= 0 && fd[1] >= 0 && fd[2] >= 0) {   /* (else the drop's own fork fails the same way, as before) */
        if (zsend(z.sock, 's', 0, fd) != 16) zdown();
        else if (!zanswer(&pid)) pid = 0;
        else if (pid <= 0) zdown(), pid = 0;
        else zforget(pid), z.kid[i] = pid, z.kidgen[i] = z.gen;
    }
    for (i = 0; i < 3; i++) if (fd[i] >= 0) sys(__NR_close, fd[i], 0, 0);
    return pid;
}

static long zwait(long pid) {   /* w for a shell a zygote forked (its code, as bash's wait); -1: none did */
    for (int i = 0; i < KIDS; i++) {
        if (z.kid[i] != pid) continue;
        long st = -1;   /* (its raw status from the zygote; -1: no child of its own) */
        if (z.pid && z.kidgen[i] == z.gen) {
            if (zsend(z.sock, 'w', pid, 0) != 16) zdown();
            else if (!zanswer(&st)) st = -1;
        }
        if (!z.pid || z.kidgen[i] != z.gen) {
            z.kid[i] = 0;
            return 128 + 9;   /* gone with its zygote (see the top) */
        }
        if (st < 0 || (st & 0xff) != 0x7f) z.kid[i] = 0;   /* (a stopped one is still the zygote's to wait for) */
        return st < 0 ? 127 : code((int)st);
    }
    return -1;
}

static void zready(char **argv, long argc, char *library) {   /* its arguments, and a signalfd; else broken */
    unsigned long chld = 1UL << (SIGCHLD - 1);
    z.broken = 1;
    if (!library || argc > 20) return;
    for (long i = 0; i < argc; i++) z.argv[i] = argv[i];
    z.argv[argc] = "z", z.argv[argc + 1] = library, z.argv[argc + 2] = 0;
    if (sys4(__NR_rt_sigprocmask, SIG_BLOCK, (long)&chld, 0, 8)) return;
    z.sigs = sys4(__NR_signalfd4, -1, (long)&chld, 8, O_NONBLOCK | O_CLOEXEC);
    if (z.sigs == 3) z.broken = 0;   /* (3, the lowest free: the zygote's socket is then never there) */
    else unblock();
}

static void serve(long uid, long gid, char **argv, long argc, char **envp, char *library) {
    static char line[512];
    long have = 0, me = sys(__NR_getpid, 0, 0, 0);
    if (sys(__NR_close_range, 3, ~0UL, 0))   /* nothing of the server's but the request and reply pipes */
        for (long fd = 3; fd < 1024; fd++) sys(__NR_close, fd, 0, 0);
    long dfl[4] = {0, 0, 0, 0};   /* SIGCHLD's default: an ignored one (inherited) would reap every child unasked */
    if (sys4(__NR_rt_sigaction, SIGCHLD, (long)dfl, 0, 8)) leave(126);
    unbound();   /* once for every shell (~80 system calls each, else): the bounding set only shrinks and a fork
                    inherits it; this process never execs, and keeps its permitted set for its children's setresuid */
    zready(argv, argc, library);
    if (!z.broken) zstart(uid, gid, envp);   /* (now: it is up when the first shell is asked for) */
    for (;;) {
        long end = 0;
        while (end < have && line[end] != '\n') end++;
        if (end == have) {   /* (a request comes in one write and is answered before the next: rarely split) */
            long r = have < (long)sizeof line ? sys(__NR_read, 0, (long)(line + have), sizeof line - have) : 0;
            if (r == -4) continue;
            if (r <= 0) leave(have ? 127 : 0);
            have += r;
            continue;
        }
        line[end] = 0;
        if (end < 3 || line[1] != ' ') leave(127);
        char *a = line + 2, *b = a;
        while (*b && *b != ' ') b++;
        if (line[0] == 's' && *b == ' ' && b[1] == '/' && a[0] == '/') {
            *b = 0;
            long pid = zspawn(a, b + 1, uid, gid, envp);
            if (pid > 0) {
                reply(pid, z.pid);
            } else {
                pid = spawn(a, b + 1, uid, gid, argv, envp);
                if (pid > 0) zforget(pid);
                reply(pid, me);
            }
        } else if (line[0] == 'w' && number(a) > 0) {
            int st = 0;
            long pid = number(a), known = zwait(pid);
            reply(known >= 0 ? known : waited(pid, &st) == pid ? code(st) : 127, 0);
        } else {
            leave(127);
        }
        end++;
        for (long i = end; i < have; i++) line[i - end] = line[i];
        have -= end;
    }
}

static int same(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

__attribute__((used)) void start(long *sp) {
    long argc = sp[0], at = 3;
    char **argv = (char **)(sp + 1), **envp = argv + argc + 1, *library = 0;
    if (argc < 4) leave(127);
    long uid = number(argv[1]), gid = number(argv[2]);
    int serving = same(argv[3], "-s");
    at += serving;
    if (serving && at + 1 < argc && same(argv[at], "-z")) library = argv[at + 1], at += 2;
    if (uid < 0 || gid < 0 || argc <= at || argv[at][0] != '/') leave(127);
    if (serving) serve(uid, gid, argv + at, argc - at, envp, library);
    unbound();
    become(uid, gid, gid);
    sys(__NR_execve, (long)argv[at], (long)(argv + at), (long)envp);
    leave(127);
}

#else
/* --- the zygote, its side: a bash builtin (this file built with -DPID_ZYGOTE -shared; see the top) ------------- */
extern int dollar_dollar_pid __attribute__((weak));   /* bash's $$ (weak: a bash without it refuses the builtin) */
extern int shell_pgrp __attribute__((weak));          /* the process group bash keeps for its own */
extern int fork(void);   /* the C library's: its own state (the thread's id, its locks) is then right in the child */

static long zreceive(int *fd, long *arg) {   /* the drop's next request: its op ('s': fd set), or -1 */
    union request q;
    struct iov v = {&q, 16};
    struct fds c;
    struct msg m = {0, 0, &v, 1, &c, sizeof c, 0};
    long r;
    c.len = 0;
    do r = sys(__NR_recvmsg, 3, (long)&m, MSG_CMSG_CLOEXEC); while (r == -4);
    if (r != 16) return -1;
    *arg = q.word[1];
    int three = m.controllen >= THREE_FDS && c.len == THREE_FDS && c.level == SOL_SOCKET && c.type == SCM_RIGHTS;
    if ((q.op[0] == 's') != three) return -1;
    for (int i = 0; three && i < 3; i++) fd[i] = c.fd[i];
    return q.op[0];
}

static int zserve(void *words) {
    long me = sys(__NR_getpid, 0, 0, 0), chld[4], dfl[4] = {0, 0, 0, 0};
    unsigned long all = ~0UL, mask;
    (void)words;
    /* not dumpable: the agent (its uid) can neither ptrace it nor read its memory; SIGCHLD at its default (bash's
       handler would reap the shells), every other signal held off (the agent may still stop or kill it) */
    if (!&dollar_dollar_pid || sys(__NR_prctl, PR_SET_DUMPABLE, 0, 0) ||
        sys4(__NR_rt_sigaction, SIGCHLD, (long)dfl, (long)chld, 8) ||
        sys4(__NR_rt_sigprocmask, SIG_SETMASK, (long)&all, (long)&mask, 8))
        return 1;
    for (;;) {
        int fd[3];
        long arg, op = zreceive(fd, &arg), answer;
        if (op == 's') {   /* (the shell touches its FIFO only once the drop has its number: `go`) */
            int go[2], piped = !sys(__NR_pipe2, (long)go, O_CLOEXEC, 0);
            char b = 0;
            long kid = piped ? fork() : -1;
            if (kid == 0) {   /* the slot shell: its descriptors, group and signals, then back to the script */
                long g = sys(__NR_getgid, 0, 0, 0);   /* (all its gids the agent's, see the drop's zstart; first: a */
                if (sys(__NR_setresgid, g, g, g)) leave(126);   /* change of ids clears the parent-death signal) */
                sys(__NR_prctl, PR_SET_PDEATHSIG, 9, 0);
                if (sys(__NR_getppid, 0, 0, 0) != me || sys(__NR_setpgid, 0, 0, 0)) leave(126);
                put(fd[1], 0);
                if (sys(__NR_dup3, fd[2], 2, 0) != 2) leave(126);
                put(fd[2], 1);
                put(fd[0], 3);   /* (over the socket) */
                if (sys(__NR_prctl, PR_SET_DUMPABLE, 1, 0) || sys4(__NR_rt_sigaction, SIGCHLD, (long)chld, 0, 8) ||
                    sys4(__NR_rt_sigprocmask, SIG_SETMASK, (long)&mask, 0, 8))
                    leave(126);
                sys(__NR_close, go[1], 0, 0);
                long r;
                do r = sys(__NR_read, go[0], (long)&b, 1); while (r == -4);
                if (r != 1) leave(126);   /* the zygote went before the drop had the number: nothing ran */
                sys(__NR_close, go[0], 0, 0);
                dollar_dollar_pid = (int)sys(__NR_getpid, 0, 0, 0);
                if (&shell_pgrp) shell_pgrp = dollar_dollar_pid;
                return 0;
            }
            if (kid > 0) sys(__NR_setpgid, kid, kid, 0);
            for (int i = 0; i < 3; i++) sys(__NR_close, fd[i], 0, 0);
            answer = kid > 0 ? kid : -11;   /* (EAGAIN: the process table is full, or its limit) */
            if (sys(__NR_write, 3, (long)&answer, 8) != 8) leave(0);
            if (piped) {
                sys(__NR_close, go[0], 0, 0);
                if (kid > 0) sys(__NR_write, go[1], (long)&b, 1);
                sys(__NR_close, go[1], 0, 0);
            }
            continue;
        } else if (op == 'w') {
            int st = 0;
            answer = waited(arg, &st) == arg ? st : -1;
        } else {
            leave(op < 0 ? 0 : 1);   /* the drop is gone (or out of step) */
        }
        if (sys(__NR_write, 3, (long)&answer, 8) != 8) leave(0);
    }
}

static char *const zserve_doc[] = {"pid's zygote: forks the slot shells (sandbox/drop.c).", 0};
struct builtin { const char *name; int (*function)(void *); int flags; char *const *long_doc; const char *short_doc;
                 void *handle; } zserve_struct = {"zserve", zserve, 1, zserve_doc, "zserve", 0};
#endif
