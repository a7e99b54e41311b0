/* pid's privilege drop, run as root by the exec server (channel.sh) for every command of the agent:

       /.pid/drop UID GID /absolute/program [ARGS...]
       /.pid/drop UID GID -s /absolute/program [ARGS...]      (serve: the slot shells' starter)

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
   Each reply is 16 bytes, the number then spaces and "\n" (the server reads it in one read). At EOF it ends; a
   request it cannot read ends it too (127), and the server then quits.

   Built by the host (sandbox/drop_helper.py: cc -static -nostdlib) and put read-only into /.pid, root's. */
#include <linux/capability.h>
#include <linux/prctl.h>
#include <asm/unistd.h>
#include <linux/fcntl.h>
#include <linux/wait.h>
#include <asm/signal.h>

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
__asm__(".globl _start\n_start:\n mov %rsp, %rdi\n and $-16, %rsp\n call start\n hlt\n");
#elif defined(__aarch64__)
static long sys4(long n, long a, long b, long c, long d) {
    register long x8 __asm__("x8") = n, x0 __asm__("x0") = a, x1 __asm__("x1") = b, x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d, x4 __asm__("x4") = 0;
    __asm__ volatile ("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
    return x0;
}
__asm__(".globl _start\n_start:\n mov x0, sp\n bl start\n brk #0\n");
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

static void become(long uid, long gid) {   /* the agent's ids, and no capability left: returns only when checked */
    if (sys(__NR_setgroups, 0, 0, 0) || sys(__NR_setresgid, gid, gid, gid) || sys(__NR_setresuid, uid, uid, uid))
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
static void reply(long v) {   /* a 16-byte reply: the number, spaces, "\n" */
    char r[16], d[20];
    int i = 0, n = 0;
    unsigned long u = v < 0 ? -v : v;
    if (v < 0) r[i++] = '-';
    do d[n++] = (char)('0' + u % 10); while ((u /= 10) && n < 19);
    while (n) r[i++] = d[--n];
    while (i < 15) r[i++] = ' ';
    r[15] = '\n';
    if (sys(__NR_write, 1, (long)r, 16) != 16) leave(0);   /* the server is gone */
}

static void put(long fd, long at) {   /* fd onto descriptor `at` (nothing to do when it is there already) */
    if (fd < 0) leave(1);
    if (fd != at && (sys(__NR_dup3, fd, at, 0) != at || sys(__NR_close, fd, 0, 0))) leave(126);
}

static long spawn(const char *fifo, const char *out, long uid, long gid, char **argv, char **envp) {
    long pid = sys(__NR_clone, SIGCHLD, 0, 0);   /* a fork (x86_64's and aarch64's clone: flags, then zeros) */
    if (pid > 0) sys(__NR_setpgid, pid, pid, 0);   /* (both sides, as a shell does: the group is there on return) */
    if (pid) return pid;
    if (sys(__NR_setpgid, 0, 0, 0)) leave(126);
    put(sys(__NR_openat, AT_FDCWD, (long)fifo, O_RDONLY), 3);   /* (a link of /proc: the server's FIFO) */
    put(sys(__NR_openat, AT_FDCWD, (long)"/dev/null", O_RDONLY), 0);
    long fd = sys4(__NR_openat, AT_FDCWD, (long)out, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0666);
    if (fd < 0 || sys(__NR_dup3, fd, 2, 0) != 2) leave(1);
    put(fd, 1);
    become(uid, gid);   /* (the bounding set went once, in serve: a fork keeps it) */
    sys(__NR_execve, (long)argv[0], (long)argv, (long)envp);
    leave(127);
    return 0;
}

static long status_of(long pid) {   /* bash's wait: the exit code, or 128 + the signal that ended or stopped it */
    int st = 0;
    long r;
    do r = sys4(__NR_wait4, pid, (long)&st, WUNTRACED, 0); while (r == -4);   /* (EINTR) */
    if (r != pid) return 127;
    if ((st & 0x7f) == 0) return (st >> 8) & 0xff;
    if ((st & 0xff) == 0x7f) return 128 + ((st >> 8) & 0xff);
    return 128 + (st & 0x7f);
}

static void serve(long uid, long gid, char **argv, char **envp) {
    static char line[512];
    long have = 0;
    if (sys(__NR_close_range, 3, ~0UL, 0))   /* nothing of the server's but the request and reply pipes */
        for (long fd = 3; fd < 1024; fd++) sys(__NR_close, fd, 0, 0);
    long dfl[4] = {0, 0, 0, 0};   /* SIGCHLD's default: an ignored one (inherited) would reap every child unasked */
    if (sys4(__NR_rt_sigaction, SIGCHLD, (long)dfl, 0, 8)) leave(126);
    unbound();   /* once for every shell (~80 system calls each, else): the bounding set only shrinks and a fork
                    inherits it; this process never execs, and keeps its permitted set for its children's setresuid */
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
            reply(spawn(a, b + 1, uid, gid, argv, envp));
        } else if (line[0] == 'w' && number(a) > 0) {
            reply(status_of(number(a)));
        } else {
            leave(127);
        }
        end++;
        for (long i = end; i < have; i++) line[i - end] = line[i];
        have -= end;
    }
}

__attribute__((used)) void start(long *sp) {
    long argc = sp[0];
    char **argv = (char **)(sp + 1), **envp = argv + argc + 1;
    if (argc < 4) leave(127);
    long uid = number(argv[1]), gid = number(argv[2]);
    int serving = argv[3][0] == '-' && argv[3][1] == 's' && !argv[3][2];
    if (uid < 0 || gid < 0 || argc < 4 + serving || argv[3 + serving][0] != '/') leave(127);
    if (serving) serve(uid, gid, argv + 4, envp);
    unbound();
    become(uid, gid);
    sys(__NR_execve, (long)argv[3], (long)(argv + 3), (long)envp);
    leave(127);
}
