/* pid's privilege drop, run by the root exec server (channel.sh) before every command of the agent:

       /.pid/drop UID GID /absolute/program [ARGS...]

   It empties the capability bounding set, then takes UID and GID with no supplementary groups, clears the ambient
   and inheritable capabilities (a uid change from root clears the permitted and effective ones), and executes the
   program as is (no PATH search). The container's no-new-privileges keeps set-uid binaries from bringing any back.
   What `setpriv --reuid --regid --clear-groups --inh-caps=-all --bounding-set=-all` does, without a C library:
   a few system calls, so a command's start costs ~1 ms less CPU in the container than through setpriv. Each step
   is checked, and what it left is read back (the bounding set, the capability sets): any failure ends it before the
   program runs, 126 (a step refused or not done), 127 (bad arguments, or the exec failed).

   Built by the host (sandbox/drop_helper.py: cc -static -nostdlib) and put read-only into /.pid, root's. */
#include <linux/capability.h>
#include <linux/prctl.h>
#include <asm/unistd.h>

/* Every call passes five arguments (the unused ones 0): prctl's ambient and bounding-set operations refuse
   anything but zeros in the arguments they do not use. */
#if defined(__x86_64__)
static long sys(long n, long a, long b, long c) {
    long r;
    register long r10 __asm__("r10") = 0, r8 __asm__("r8") = 0;
    __asm__ volatile ("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                      : "rcx", "r11", "memory");
    return r;
}
__asm__(".globl _start\n_start:\n mov %rsp, %rdi\n and $-16, %rsp\n call start\n hlt\n");
#elif defined(__aarch64__)
static long sys(long n, long a, long b, long c) {
    register long x8 __asm__("x8") = n, x0 __asm__("x0") = a, x1 __asm__("x1") = b, x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = 0, x4 __asm__("x4") = 0;
    __asm__ volatile ("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
    return x0;
}
__asm__(".globl _start\n_start:\n mov x0, sp\n bl start\n brk #0\n");
#else
#error "pid's drop helper knows x86_64 and aarch64 (elsewhere pid uses setpriv)"
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

__attribute__((used)) void start(long *sp) {
    long argc = sp[0];
    char **argv = (char **)(sp + 1), **envp = argv + argc + 1;
    if (argc < 4) leave(127);
    long uid = number(argv[1]), gid = number(argv[2]);
    if (uid < 0 || gid < 0 || argv[3][0] != '/') leave(127);
    long last = 0;   /* the kernel's capabilities: EINVAL beyond the last (every kernel pid runs on has > 33) */
    for (; last < 64; last++) {
        long r = sys(__NR_prctl, PR_CAPBSET_DROP, last, 0);
        if (r == -22 && last > 33) break;
        if (r) leave(126);
    }
    for (long cap = 0; cap < last; cap++)
        if (sys(__NR_prctl, PR_CAPBSET_READ, cap, 0) != 0) leave(126);
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
    sys(__NR_execve, (long)argv[3], (long)(argv + 3), (long)envp);
    leave(127);
}
