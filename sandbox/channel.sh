# pid exec channel: a long-lived request/reply server on stdin/stdout, one per channel, running as root.
#
# Why a script and not `docker exec` per call: one exec costs ~60 ms; a request here costs about a millisecond.
# It runs in any image with /bin/sh and POSIX utilities; under bash it takes faster paths (printf -v, job
# control for process groups, pre-started command shells). Per request it forks as little as possible.
#
# Trust: this server is pid's, the commands it starts are the agent's. The server runs as root; every agent
# command (and every file read or write the tools make) runs as the agent's uid with no capabilities, in its own
# process group, started through `setpriv` from a fixed PATH. The server's FIFOs live in /.pid/run (0700), its
# output files in /.pid/out (0711: the agent can read an output file it is told the name of, never list, replace
# or create one), so the agent can neither read, write, signal nor ptrace anything of the server's. With a job disk,
# both directories are on pid's own disk, not the job's: what the agent does to the job's disk (every block, every
# inode) cannot keep a command's output from being written. The host still
# treats every reply as untrusted (bounded in bytes and time): with `--user root` none of the above holds.
#
# Installed as /.pid/channel.sh and run as `bash|sh channel.sh <role> <channel id> <workdir> <uid> <gid>`, its stdin
# and stdout a `docker exec`'s attached stream, or two FIFOs of /.pid/run that the host holds (the container's entry
# starts the first servers so: see channel.py).
# role "agent": commands run as uid:gid. role "control": commands run as root (pid's own work: the base
# commit, the patch), and the kill requests go here, so that killing never needs a new process.
# Nothing is written to stdout before the first request ("h"): the host reads the stream only after the HTTP
# upgrade, and output racing it could be lost.
#
# Requests are one line: an op letter and space separated fields; a command follows its line as <len> raw bytes
# (read in one block). The only paths in requests are output files this server reported (/.pid/out/N.M), which
# the host checks. Raw data in replies is followed directly by "<nonce>", a random token of the request, so no
# content can fake the end of a reply.
#   h                          -> "R <shell> <pids-events>" | "F <reason>"   (hello)
#   x <emit> <nonce> <len> + the command
#                              -> "P <pgid> <output-file>" when started; when it ends the first <emit> bytes of
#                                 its output, then "<nonce> <rc> <pids-events>\n"
#   y <slot> <emit> <nonce> <len> + the command
#                              -> like x, on slot shell <slot> (0 or 1), to whose FIFO the host wrote the command
#                                 itself (bash agent servers only, <len> at most 4000, else "E EPROTO": see
#                                 pid_direct)
#   w <n> <nonce> <len> + the command + n raw bytes
#                              -> like x; the bytes are stored in a file first, passed to the command as "$1"
#   W <n> <nonce> <len> + the command + n bytes: the same, bash only, for small data: "\\" for a backslash and
#                                 "\0000" for NUL, so that builtins read and decode it (read -N, printf %b): no fork
#   c <tail> <nonce> <output-file>
#                              -> "C <newlines> <bytes>", its last <tail> bytes, "<nonce>\n"; the file is
#                                 kept (otherwise removed later)
#   T <keep> <output-file>     -> "T <cut>": keeps the output file's disk use bounded while its command runs: all
#                                 but the last ~<keep> bytes become a hole (the size, and so the byte count, stay);
#                                 their newlines are counted in <output-file>.cut ("<cut offset> <lines cut>")
#   t <offset> <max> <nonce> <output-file>
#                              -> "S <size>" line, bytes [max(offset, size-max), size), "<nonce>\n"
#   (x, y and w answer "B" instead, starting nothing, when the process table is full: the host clears it, retries)
#   k <pgid>                   -> "K <rc>"  (SIGKILL the process group: a builtin, no fork)
#   K                          -> "K <n> <pids-events>"   (SIGKILL every process of the agent's uid: for a full
#                                 process table)
#   q                          -> exit
# <pids-events> counts the forks the container's pids limit refused so far (0 when the cgroup does not say).
pid_opath=${PID_IMAGE_PATH:-/usr/local/bin:/usr/bin:/bin}   # the image's PATH, for the agent's commands
unset PID_IMAGE_PATH
PATH=/usr/sbin:/usr/bin:/sbin:/bin   # pid's: system directories only (set by the boot line already)
export PATH
pid_role=$1
pid_cid=$2
pid_wd=$3
pid_uid=$4
pid_gid=$5
pid_dir=/.pid/out
pid_fifo=/.pid/run/cmd.$pid_cid
pid_mark=/.pid/run/mark.$pid_cid
pid_napfd=
pid_shbin=sh
pid_n=0
pid_junk=
pid_junkn=0
pid_um=022
pid_pe=0
pid_cg=
pid_pmax=
for pid_f in /sys/fs/cgroup/pids /sys/fs/cgroup; do
    [ -r "$pid_f/pids.max" ] && { pid_cg=$pid_f; break; }
done
# The limit is fixed for the container's life: read once ("max", no limit, leaves it empty). pid_full then reads
# only pids.current.
[ -n "$pid_cg" ] && read -r pid_pmax <"$pid_cg/pids.max"
case $pid_pmax in ''|*[!0-9]*) pid_pmax= ;; esac
if [ -n "${BASH_VERSION:-}" ]; then
    pid_shell=bash
    set -m                      # async jobs get their own process group: the pgid we kill
    # The server counts bytes (read -N, ${#var}): its own locale is C, set once and not exported (a local LC_ALL in
    # each function cost ~50 us per call). An LC_ALL of the image's goes back to the agent in its slot shell.
    pid_lcall=${LC_ALL:-}
    export -n LC_ALL
    LC_ALL=C
else
    pid_shell=sh
fi
pid_fast=   # the agent's commands run on pre-started slot shells (bash): pid_slotrun
[ "$pid_role" = agent ] && [ "$pid_shell" = bash ] && pid_fast=1
set -f                          # fields are split on spaces; never glob them

# The agent's commands drop to its uid, with no capabilities at all (effective, permitted, inheritable, ambient
# or bounding); with no-new-privileges on the container no set-uid binary can bring any back.
# (Set up in pid_hello, with the binaries' absolute paths resolved on pid's PATH.)
pid_drop=
pid_setsid=setsid

pid_events() {  # pid_pe <- refused forks so far, read without a fork
    pid_pe=0
    [ -n "$pid_cg" ] && read -r pid_k pid_pe <"$pid_cg/pids.events"   # (the server's stderr is /dev/null)
    case $pid_pe in ''|*[!0-9]*) pid_pe=0 ;; esac
}
pid_full() {  # true when the container's process table is (nearly) full: starting anything would hang in fork
    [ -n "$pid_pmax" ] || return 1
    read -r pid_pcur <"$pid_cg/pids.current" || return 1
    case $pid_pcur in *[!0-9]*|'') return 1 ;; esac
    [ $((pid_pcur + 8)) -ge "$pid_pmax" ]
}

if head --version 2>/dev/null | grep -q GNU; then
    pid_take() { head -c "$1"; }                    # GNU head never reads past N bytes of a pipe
else
    pid_take() { dd bs=1 count="$1" 2>/dev/null; }  # slow but exact
fi

if [ "$pid_shell" = bash ]; then
    # The first $2 bytes of file $1, exactly, without a fork: bash's `read` reads regular files in blocks.
    # -d '' stops at each NUL byte (which a shell variable cannot hold) so NULs are written back one by one;
    # a file with many NULs is finished by head instead.
    pid_emit() {
        local pid_left=$2 pid_want pid_c pid_nuls=0
        while [ "$pid_left" -gt 0 ]; do
            pid_want=$pid_left
            if ! IFS= read -r -d '' -n "$pid_want" pid_c; then
                printf '%s' "$pid_c"
                return 0
            fi
            printf '%s' "$pid_c"
            pid_left=$((pid_left - ${#pid_c}))
            [ "${#pid_c}" -lt "$pid_want" ] || continue
            printf '\0'
            pid_left=$((pid_left - 1))
            pid_nuls=$((pid_nuls + 1))
            if [ "$pid_nuls" -gt 64 ] && [ "$pid_left" -gt 0 ]; then
                tail -c +$(($2 - pid_left + 1)) -- "$1" | head -c "$pid_left"
                return 0
            fi
        done <"$1"
        return 0
    }
else
    pid_emit() { head -c "$2" -- "$1"; }
fi

# bash: command shells are started ahead of time, already running as the agent, blocked reading their command
# from a FIFO, so start-up (setpriv, bash: ~2 ms) is off the request path. Two slots alternate, so back-to-back
# requests still find a shell that is up. Each is a fresh bash (own $$, no state of this server) in its own
# process group and evaluates the command as `bash -c` would. The server holds each slot's FIFO open read-write
# (fd 4, fd 5) for its whole life, so nothing blocks in open() and a command written before the shell is up
# waits in the FIFO. A command comes as its length in bytes, a newline, then the command, read in one block.
# A waiting slot already runs as the agent: code the agent ran before could reach it (ptrace is the agent's right
# over its own processes), and so the agent's own later commands (and pid's file snippets, which run as the agent),
# never the server or anything pid runs as root. So
# each shell opens its FIFO anew, read-only, while still root: a descriptor taken from it can neither write into the
# FIFO (bytes there must be pid's alone) nor change the flags of the server's own open (O_NONBLOCK would fail the
# next shells' reads). It can change the pipe's size, down to one page (F_SETPIPE_SZ): so no more than one page ever
# goes into a FIFO, which an empty pipe always takes at once, stopped reader or not. A longer command is put in a
# file of root's, and the FIFO gets "<length> <file>". A command that arrives cut short (that file could not be
# written whole: a full disk) is not run, not even its first part: status 125 and a line that says so.
# A command needs the working directory (pi's bash refuses to run without it): when it is gone the command is not run,
# its output is pi's message and its status 212; pid's own file snippets, which name absolute paths, start with the
# line "#pid:anywhere" and run anyway.
# setpriv and the shell start in the C locale (setpriv would load the agent's locale from a dozen files, for nothing);
# the shell then loads the agent's locale (its LANG, or the image's LC_ALL: $3) before it waits, reads the command
# in C (its length is in bytes), and is back in the agent's locale, already loaded, before the command runs.
# The umask is set before the wait, the working directory after it (it may change meanwhile).
# The image's loader and shell variables come back here, in the agent's own shell (sandbox/image_env.py): pid's
# root processes run with them empty. The shell would have read BASH_ENV as it started: it reads it now, quietly
# when it is missing, as bash does, and with arguments of its own, so that its `set --` cannot change pid's.
pid_zcode='[ -z "${PID_IMAGE_ENV-}" ] || { eval "$PID_IMAGE_ENV"; unset PID_IMAGE_ENV; [ ! -r "${BASH_ENV-}" ] || . "$BASH_ENV" "$@"; }
umask "$1"; if [ -n "$3" ]; then LC_ALL=$3; else unset LC_ALL; fi; LC_ALL=C
read -r n f <&3 && if [ -z "$f" ]; then IFS= read -r -N "$n" c <&3; else IFS= read -r -N "$n" c <"$f"; fi; exec 3<&-
[ "${#c}" = "$n" ] || { printf "pid: the command reached its shell cut short (%s of %s bytes; is the job'"'"'s disk full?): not run" "${#c}" "$n"; exit 125; }
if [ -n "$3" ]; then LC_ALL=$3; else unset LC_ALL; fi; unset n f; cd -- "$2" 2>/dev/null || case $c in "#pid:anywhere"*) ;; *)
printf "Working directory does not exist: %s\nCannot execute bash commands." "$2"; exit 212 ;; esac; set --; eval "unset c; $c"'
pid_bash=bash
pid_slot=0
pid_z0=
pid_z1=
pid_drain() {  # $1: a slot's FIFO fd. A slot killed before it read all of its command (a cancel at once) left the
    # rest in the FIFO: the next shell must not take it for its own command.
    read -r -t 0 -u "$1" || return 0   # (the usual case: nothing left)
    pid_k=0   # (pid's own bytes only, a page at most: the agent cannot write there; 64 reads is a safety bound)
    while [ "$pid_k" -lt 64 ] && read -r -t 0 -u "$1"; do
        IFS= read -r -d '' -t 0.01 -N 65536 -u "$1" pid_dr
        pid_k=$((pid_k + 1))
    done
    pid_dr=
    pid_k=
    # A `read -N` that times out leaves what it took from the FIFO in bash's shared read buffer, where the next
    # request's `read -N` would find it first (the agent's bytes read as pid's requests). mapfile empties that buffer
    # before it reads (a builtin: no fork).
    mapfile pid_drained </dev/null
}
pid_spawn() {  # $1: slot
    pid_n=$((pid_n + 1))
    if [ "$1" = 0 ]; then
        LC_ALL=C PATH=$pid_opath $pid_drop $pid_bash -c "$pid_zcode" bash "$pid_um" "$pid_wd" "$pid_lcall" >"$pid_dir/$pid_cid.$pid_n" 2>&1 </dev/null 3</proc/self/fd/4 4>&- 5>&- 6>&- &
        pid_z0=$!
        pid_zo0=$pid_dir/$pid_cid.$pid_n
    else
        LC_ALL=C PATH=$pid_opath $pid_drop $pid_bash -c "$pid_zcode" bash "$pid_um" "$pid_wd" "$pid_lcall" >"$pid_dir/$pid_cid.$pid_n" 2>&1 </dev/null 3</proc/self/fd/5 4>&- 5>&- 6>&- &
        pid_z1=$!
        pid_zo1=$pid_dir/$pid_cid.$pid_n
    fi
}
pid_alive() {  # whether slot shell $1 can still take a command. kill -0 passes a shell that was killed (the clearing
    # of a full process table kills the waiting shells too) but has not died yet (a frozen container's SIGKILL waits
    # for the thaw, then for the CPU) or was not reaped yet: /proc says so (fields 3, 9, 31: state, flags, pending
    # signals: a zombie, PF_EXITING or PF_SIGNALED, a SIGKILL on its way). A shell stopped by a tracer (state t) is
    # killed here, and its tracer with it, as is the tracer of a zombie: the caller then waits for it (pid_untrace).
    kill -0 "$1" || return 1
    pid_s=
    IFS= read -r -N 4096 pid_s <"/proc/$1/stat" || [ -n "$pid_s" ] || return 1   # (whole: see pid_field)
    set -- "$1" ${pid_s##*) }   # (numbers and a letter: nothing to glob)
    pid_s=
    case $2 in
        [ZX]*) pid_untrace "$1"; return 1 ;;
        t*) kill -9 "$1"; pid_untrace "$1"; return 1 ;;
    esac
    [ $((${8:-0} & 0x404 | ${30:-0} & 256)) = 0 ]
}
# ptrace is the agent's right over its own processes, pid's slot shells among them. A tracer that stops a shell and
# never waits holds it: stopped, or, once killed, a zombie that its parent (this server) cannot reap, so the server's
# wait for it, and with it every later request, would hang. A shell the server must wait for is let go by killing
# its tracer: a process of the agent's uid (pid's own processes never trace; a root one, with an agent that is not
# root, is an operator's, and left alone).
pid_untrace() {  # $1: a process id
    case $1 in ''|*[!0-9]*) return 0 ;; esac
    { pid_field "/proc/$1" TracerPid; } 2>/dev/null
    pid_tp=$pid_u
    case $pid_tp in ''|0|1|"$$") return 0 ;; esac
    { pid_field "/proc/$pid_tp" Uid; } 2>/dev/null
    [ "$pid_u" = "$pid_uid" ] && kill -9 "$pid_tp" 2>/dev/null
    return 0
}
pid_take_slot() {  # sets pid_pid/pid_out to the current slot's shell, starting one if it is gone
    if [ "$pid_slot" = 0 ]; then pid_pid=$pid_z0; else pid_pid=$pid_z1; fi
    if [ -z "$pid_pid" ] || ! pid_alive "$pid_pid"; then   # (stderr is /dev/null already: see channel.py)
        [ -n "$pid_pid" ] && wait "$pid_pid"
        pid_drain $((4 + pid_slot))
        pid_spawn "$pid_slot"
        if [ "$pid_slot" = 0 ]; then pid_pid=$pid_z0; else pid_pid=$pid_z1; fi
    fi
    if [ "$pid_slot" = 0 ]; then pid_out=$pid_zo0; else pid_out=$pid_zo1; fi
}

# A used slot's successor (a fork, and setpriv and bash starting: ~5 ms of CPU) is started while the other slot's
# command runs, or when the host sent nothing for ~1 ms after a reply: not at once, since a reply wakes the host's
# reader on this CPU (a pipe write wakes its reader where the writer runs, expecting the writer to sleep next).
pid_refill() {
    pid_due=
    pid_full && return 0                  # pid_take_slot starts them when they are needed (and possible)
    [ -n "$pid_z0" ] || pid_spawn 0
    [ -n "$pid_z1" ] || pid_spawn 1
}

pid_forget() {  # output files nobody needs; removed in batches (pid_sweep) to save a fork per call
    pid_junk="$pid_junk $1"
    pid_junkn=$((pid_junkn + 1))
}
pid_sweep() {
    if [ "$pid_junkn" -ge 32 ]; then
        rm -f $pid_junk
        pid_junk=
        pid_junkn=0
    fi
}

pid_start() {  # pid_cmd -> a running command: pid_pid, pid_out (not for the slot shells: pid_slotrun)
    pid_n=$((pid_n + 1))
    pid_out=$pid_dir/$pid_cid.$pid_n
    if [ "$pid_role" = control ] && [ "$pid_shell" = bash ]; then   # pid's own commands: as root, in a
        ( cd / && exec env -i PATH="$PATH" HOME=/.pid LC_ALL=C bash -c "$pid_cmd" ) </dev/null >"$pid_out" 2>&1 &
    elif [ "$pid_role" = control ]; then                            # clean environment, from /
        ( cd / && exec env -i PATH="$PATH" HOME=/.pid LC_ALL=C $pid_setsid sh -c "$pid_cmd" ) </dev/null >"$pid_out" 2>&1 &
    else
        # (the image's variables come back in the agent's command alone: see pid_zcode)
        ( cd "$pid_wd" 2>/dev/null || pid_nowd; PATH=$pid_opath; [ -z "${PID_IMAGE_ENV-}" ] ||
          pid_cmd="eval \"\$PID_IMAGE_ENV\"; unset PID_IMAGE_ENV
$pid_cmd"; exec $pid_drop $pid_setsid "$pid_shbin" -c "$pid_cmd" "$pid_shell" ) </dev/null >"$pid_out" 2>&1 &
    fi
    pid_pid=$!
}

pid_nowd() {  # the sh path's twin of the working directory check in pid_zcode (run in the command's subshell)
    case $pid_cmd in
        "#pid:anywhere"*) ;;
        *) printf 'Working directory does not exist: %s\nCannot execute bash commands.' "$pid_wd"; exit 212 ;;
    esac
}

pid_nap() {  # about 10 ms; bash times out a read on its own idle FIFO (fd 6), no fork
    if [ -n "$pid_napfd" ]; then IFS= read -r -t 0.01 -u 6 pid_k; else sleep 0.01; fi
}

# A command's background processes may still write to its output just after it ended ("(sleep .05; echo x) &");
# pi keeps reading while its pipe has writers, until they fall silent for 100 ms. Here: only when processes of the
# command's group are left (a builtin check: the usual case costs nothing) and one of the agent's processes holds
# the output file open (seen as the agent: pid's server may not look into the agent's /proc entries), wait until
# the group is gone or the file went unwritten for ~100 ms, 1 s at most (never with the process table full: a fork
# bomb is no output to wait for).
pid_scan='set +f; for f in /proc/[0-9]*/fd/*; do [ "$f" -ef "$1" ] && exit 0; done; exit 1'
pid_linger() {  # $1: pgid, $2: output file; called only while processes of the group are left
    ! pid_full || return 0
    PATH=$pid_opath $pid_drop $pid_shbin -c "$pid_scan" pid-scan "$2" </dev/null >/dev/null 2>&1 4>&- 5>&- 6>&- || return 0
    pid_quiet=0
    pid_ticks=0
    true >"$pid_mark"   # (not `:`: a failed redirection on a special builtin ends dash)
    while [ "$pid_quiet" -lt 10 ] && [ "$pid_ticks" -lt 100 ] && kill -0 -"$1" 2>/dev/null && ! pid_full; do
        pid_nap
        if [ "$2" -nt "$pid_mark" ]; then
            pid_quiet=0
            true >"$pid_mark"
        else
            pid_quiet=$((pid_quiet + 1))
        fi
        pid_ticks=$((pid_ticks + 1))
    done
}

# A command's output file is made (as root) before its shell starts: when it could not be (no inode left where output
# goes: without a job disk, or with a root agent, that is the agent's to fill; ext4 keeps blocks for root, not
# inodes), no shell ran, and the command ends with 126 and this line.
pid_unmade="pid: the command could not start: its output file could not be made (no space or no inodes left for output)"

pid_finish() {  # wait for pid_pid, then reply with the head of its output and its status
    echo "P $pid_pid $pid_out"
    wait "$pid_pid"
    pid_rc=$?
    [ "$pid_role" = agent ] && kill -0 -"$pid_pid" && pid_linger "$pid_pid" "$pid_out"
    if [ ! -e "$pid_out" ]; then   # (see pid_unmade)
        pid_rc=126
        [ "$pid_emitn" -gt 0 ] && printf '%s' "$pid_unmade" | head -c "$pid_emitn"
    fi
    [ -s "$pid_out" ] && pid_emit "$pid_out" "$pid_emitn"
    pid_events
    echo "$pid_nonce $pid_rc $pid_pe"
    pid_forget "$pid_out"
}

pid_readcmd() {  # $1 bytes of command from stdin -> pid_cmd
    if [ "$pid_shell" = bash ]; then
        pid_readn "$1"
        pid_cmd=$pid_data
        pid_data=
    else
        pid_cmd=$(pid_take "$1")
    fi
    [ -n "$pid_cmd" ] || pid_cmd=:
}

# The agent's command on a slot shell, from start to reply: the hot path, so its steps are written inline (a bash
# function call costs ~20 us here) and the reply after the "P" line is one write when the output's head holds no NUL.
pid_slotrun() {
    if [ -n "$pid_pmax" ] && read -r pid_pcur <"$pid_cg/pids.current"; then   # pid_full
        case $pid_pcur in ''|*[!0-9]*) ;; *) [ $((pid_pcur + 8)) -lt "$pid_pmax" ] || { echo B; return; } ;; esac
    fi
    if [ "$pid_slot" = 0 ]; then pid_pid=$pid_z0 pid_out=$pid_zo0; else pid_pid=$pid_z1 pid_out=$pid_zo1; fi
    [ -n "$pid_pid" ] && pid_alive "$pid_pid" || pid_take_slot
    # The host sends nothing more until it has this command's "P" line: anything to read now is its EOF. It gave up
    # on this request (its deadline for the start passed, or it stopped sending half-way): nothing of it may run.
    read -r -t 0 && pid_quit
    if [ "${#pid_cmd}" -gt 4000 ]; then   # (bytes: the server's locale is C) more than a page: through a file
        pid_n=$((pid_n + 1))
        printf '%s' "$pid_cmd" >"$pid_dir/$pid_cid.$pid_n.cmd"
        pid_forget "$pid_dir/$pid_cid.$pid_n.cmd"
        printf '%s %s\n' "${#pid_cmd}" "$pid_dir/$pid_cid.$pid_n.cmd" >&$((4 + pid_slot))
    elif [ "$pid_slot" = 0 ]; then
        printf '%s\n%s' "${#pid_cmd}" "$pid_cmd" >&4
    else
        printf '%s\n%s' "${#pid_cmd}" "$pid_cmd" >&5
    fi
    pid_slotend
}

# y <slot> <emit> <nonce> <len> + the command: the host wrote "<len>\n<command>" into that slot's FIFO itself, just
# before this request, so the waiting shell is already running it. The copy here is for a shell that died before
# it took the command (killed by the agent's own code): nothing of it ran, its remains are drained and a new shell
# gets this copy. A slot with no shell yet (pid_refill had not started one) gets one that finds the host's bytes.
pid_direct() {
    pid_cmd=
    [ "$5" -gt 0 ] && IFS= read -r -N "$5" pid_cmd
    [ -n "$pid_fast" ] && [ "$5" -le 4000 ] || { echo "E EPROTO"; return; }   # (a page at most: see above)
    [ "$pid_junkn" -lt 32 ] || pid_sweep
    pid_emitn=$3
    pid_nonce=$4
    case $2 in 0|1) pid_slot=$2 ;; *) echo "E EPROTO"; return ;; esac
    pid_fd=$((4 + pid_slot))
    if [ "$pid_slot" = 0 ]; then pid_pid=$pid_z0; else pid_pid=$pid_z1; fi
    if [ -z "$pid_pid" ]; then
        pid_full && { pid_drain $pid_fd; echo B; return; }
        pid_spawn "$pid_slot"
    elif read -r -t 0 -u $pid_fd && ! pid_alive "$pid_pid"; then
        wait "$pid_pid"
        pid_drain $pid_fd
        if [ "$pid_slot" = 0 ]; then pid_z0=; else pid_z1=; fi
        pid_full && { echo B; return; }
        pid_spawn "$pid_slot"
        printf '%s\n%s' "${#pid_cmd}" "$pid_cmd" >&$pid_fd
    fi
    if [ "$pid_slot" = 0 ]; then pid_pid=$pid_z0 pid_out=$pid_zo0; else pid_pid=$pid_z1 pid_out=$pid_zo1; fi
    pid_slotend
}

# The end of a command on a slot shell: wait for it, reply, and leave the slot's FIFO empty for its next shell (a
# shell killed before it read all of its command left the rest there: no request of the host's is in flight).
pid_slotend() {
    echo "P $pid_pid $pid_out"
    [ -z "$pid_due" ] || pid_refill
    wait "$pid_pid"
    pid_rc=$?
    if kill -0 -"$pid_pid"; then
        # The shell itself is still there when it was stopped (wait returns then, 128 + the signal): it goes now,
        # not to take a later command from its FIFO if the agent lets it go on.
        kill -0 "$pid_pid" && { kill -9 "$pid_pid"; pid_untrace "$pid_pid"; wait "$pid_pid"; }
        kill -0 -"$pid_pid" && pid_linger "$pid_pid" "$pid_out"
    fi
    pid_pe=0                                                                  # pid_events
    [ -n "$pid_cg" ] && read -r pid_k pid_pe <"$pid_cg/pids.events"
    case $pid_pe in ''|*[!0-9]*) pid_pe=0 ;; esac
    pid_c=
    if [ ! -e "$pid_out" ]; then   # (see pid_unmade)
        pid_rc=126
        pid_c=${pid_unmade:0:$pid_emitn}
    elif [ "$pid_emitn" -gt 0 ] && [ -s "$pid_out" ]; then
        # read stops early only at a NUL byte, which a variable cannot hold: then pid_emit writes it byte-exact
        if IFS= read -r -d '' -n "$pid_emitn" pid_c <"$pid_out" && [ "${#pid_c}" -lt "$pid_emitn" ]; then
            pid_c=
            pid_emit "$pid_out" "$pid_emitn"
        fi
    fi
    printf '%s%s %s %s\n' "$pid_c" "$pid_nonce" "$pid_rc" "$pid_pe"
    pid_c=
    pid_junk="$pid_junk $pid_out"                                             # pid_forget
    pid_junkn=$((pid_junkn + 1))
    read -r -t 0 -u $((4 + pid_slot)) && pid_drain $((4 + pid_slot))
    if [ "$pid_slot" = 0 ]; then pid_z0=; else pid_z1=; fi    # (reaped: its number may be reused)
    pid_due=1                             # its successor starts in pid_refill
    pid_slot=$((1 - pid_slot))
}

pid_exec() {  # x emit nonce len, then the command
    [ "$pid_junkn" -lt 32 ] || pid_sweep
    pid_emitn=$2
    pid_nonce=$3
    if [ -n "$pid_fast" ]; then   # pid_readcmd, inline
        pid_cmd=
        [ "$4" -gt 0 ] && IFS= read -r -N "$4" pid_cmd
        [ -n "$pid_cmd" ] || pid_cmd=:
        pid_slotrun
        return
    fi
    pid_readcmd "$4"
    if [ "$pid_role" = agent ] && pid_full; then echo B; return; fi
    [ "$pid_shell" != bash ] || ! read -r -t 0 || pid_quit   # (see pid_slotrun; POSIX sh cannot tell)
    pid_start
    pid_finish
}

pid_upload() {  # w|W n nonce len, then the command, then n bytes: stored in a file the command gets as "$1"
    pid_sweep
    pid_readcmd "$4"
    pid_n=$((pid_n + 1))
    pid_in=$pid_dir/$pid_cid.$pid_n.in
    pid_stored=1
    if [ "$1" = W ]; then
        pid_readn "$2"
        printf '%b' "$pid_data" >"$pid_in" || pid_stored=
        pid_data=
    elif [ "$2" -gt 0 ]; then
        # Every one of the n bytes leaves stdin, whatever becomes of the file (a full disk fails its creation or a
        # write): bytes left there would be read as pid's requests.
        pid_take "$2" | { cat >"$pid_in" || { cat >/dev/null; exit 1; }; } || pid_stored=
    else
        true >"$pid_in" || pid_stored=   # (not `:`: see pid_linger)
    fi
    [ -n "$pid_stored" ] || pid_cmd="#pid:anywhere
echo 'pid: the uploaded data could not be stored (no space or no inodes left for it)' >&2; exit 95"
    pid_emitn=0
    pid_nonce=$3
    case $pid_cmd in   # "$1" is set after the first line when that is the "#pid:anywhere" mark
        "#pid:anywhere
"*) pid_cmd="#pid:anywhere
set -- $pid_in
${pid_cmd#*
}" ;;
        *) pid_cmd="set -- $pid_in
$pid_cmd" ;;
    esac
    pid_forget "$pid_in"
    if [ -n "$pid_fast" ]; then pid_slotrun; return; fi
    if [ "$pid_role" = agent ] && pid_full; then echo B; return; fi
    [ "$pid_shell" != bash ] || ! read -r -t 0 || pid_quit   # (see pid_slotrun; POSIX sh cannot tell)
    pid_start
    pid_finish
}

pid_cutinfo() {  # pid_cut, pid_cutl <- what pid_trim dropped from the front of file $1
    pid_cut=0
    pid_cutl=0
    [ -f "$1.cut" ] && read -r pid_cut pid_cutl <"$1.cut" 2>/dev/null
    case $pid_cut$pid_cutl in *[!0-9]*|'') pid_cut=0; pid_cutl=0 ;; esac
}

pid_readn() { pid_data=; [ "$1" -gt 0 ] && IFS= read -r -N "$1" pid_data; }  # bash: blocks, no fork

pid_count() {  # c tail nonce path
    pid_p=$4
    pid_tb=$2
    pid_nonce=$3
    pid_cutinfo "$pid_p"
    if [ "$pid_cut" = 0 ]; then
        set -- $(wc -l -c <"$pid_p" 2>/dev/null)
    else   # only the kept tail is read; the front's newlines were counted when it was cut
        pid_size=$(wc -c <"$pid_p" 2>/dev/null)
        set -- $(($(tail -c +$((pid_cut + 1)) "$pid_p" | wc -l) + pid_cutl)) "$pid_size"
    fi
    echo "C ${1:-0} ${2:-0} $pid_cut"
    tail -c "$pid_tb" "$pid_p" | head -c "$pid_tb"
    echo "$pid_nonce"
    case $pid_junk in
        *" $pid_p")
            pid_junk=${pid_junk%" $pid_p"}
            pid_junkn=$((pid_junkn - 1))
            ;;
    esac
}

pid_tail() {  # t offset max nonce path: output appended since offset, at most the last max bytes of it
    pid_p=$5
    pid_size=$(wc -c <"$pid_p" 2>/dev/null) || pid_size=0
    pid_size=$((pid_size + 0))
    echo "S $pid_size"
    if [ "$pid_size" -gt "$2" ]; then
        pid_from=$2
        [ $((pid_size - $3)) -gt "$pid_from" ] && pid_from=$((pid_size - $3))
        tail -c +$((pid_from + 1)) "$pid_p" | head -c $((pid_size - pid_from))
    fi
    echo "$4"
}

pid_trim() {  # T keep path
    pid_p=$3
    pid_cutinfo "$pid_p"
    pid_size=$(wc -c <"$pid_p" 2>/dev/null) || pid_size=0
    pid_size=$((pid_size + 0))
    if [ $((pid_size - pid_cut)) -gt $(($2 * 2)) ]; then
        pid_new=$(((pid_size - $2) / 1048576 * 1048576))
        pid_nl=$(tail -c +$((pid_cut + 1)) "$pid_p" | head -c $((pid_new - pid_cut)) | wc -l)
        if fallocate -p -o "$pid_cut" -l $((pid_new - pid_cut)) "$pid_p" 2>/dev/null; then
            pid_cut=$pid_new
            pid_cutl=$((pid_cutl + pid_nl))
            echo "$pid_cut $pid_cutl" >"$pid_p.cut"
        fi
    fi
    echo "T $pid_cut"
}

pid_lf='
'
if [ "$pid_shell" = bash ]; then
    # bash's `read` of lines from a regular file reads ahead into a buffer all its reads share, then seeks the file
    # back to the end of the line. A process that exits in between makes that seek fail, and the rest of its status
    # file stays in the buffer: the next `read -N` (the next request's command) would begin with it. `read -N`
    # never reads past what it asks for, so the whole file in one read leaves nothing behind.
    pid_field() {  # pid_u <- the first number of field $2 of process directory $1's status (Uid: the real uid;
        pid_s=         # empty if it is gone)
        IFS= read -r -N 16384 pid_s <"$1/status"
        case $pid_s in
            *"${pid_lf}$2:"*)
                pid_u=${pid_s#*"${pid_lf}$2:"}
                pid_u=${pid_u#"${pid_u%%[0-9]*}"}
                pid_u=${pid_u%%[!0-9]*} ;;
            *) pid_u= ;;
        esac
        pid_s=
    }
else   # POSIX sh reads byte by byte: nothing is read ahead
    pid_field() {
        pid_u=
        while read -r pid_k pid_v pid_rest; do
            [ "$pid_k" = "$2:" ] && { pid_u=$pid_v; break; }
        done <"$1/status"
    }
fi

pid_killuid() {  # SIGKILL every process of the agent's uid, with builtins only: the process table may be full
    pid_killed=0
    # (a root agent shares pid's uid: only its commands' process groups are killed, by "k")
    [ "$pid_uid" = 0 ] && { pid_events; echo "K 0 $pid_pe"; return; }
    set +f
    for pid_pass in 1 2 3 4 5 6 7 8 9 10; do
        pid_found=0
        for pid_p in /proc/[0-9]*; do
            pid_u=
            { pid_field "$pid_p" Uid; } 2>/dev/null
            if [ "$pid_u" = "$pid_uid" ]; then
                kill -9 "${pid_p#/proc/}" 2>/dev/null && pid_found=$((pid_found + 1))
            fi
        done
        pid_killed=$((pid_killed + pid_found))
        [ "$pid_found" = 0 ] && break
    done
    set -f
    pid_events
    echo "K $pid_killed $pid_pe"
}

pid_hello() {
    umask 077
    [ -d /.pid/run ] || mkdir -p /.pid/run /.pid/out || { echo "F cannot create /.pid"; return; }
    if [ "$pid_role" = control ]; then
        chmod 711 /.pid /.pid/out && chmod 700 /.pid/run || { echo "F cannot set up /.pid"; return; }
        mkdir -p /.pid/git "$pid_wd" && chown "$pid_uid:$pid_gid" "$pid_wd" || { echo "F cannot create $pid_wd"; return; }
        [ -n "${HOME:-}" ] && mkdir -p "$HOME" && chown "$pid_uid:$pid_gid" "$HOME"
        if [ "$pid_uid" != 0 ]; then
            command -v setpriv >/dev/null 2>&1 ||
                { echo "F the image has no setpriv (util-linux), needed to run commands as a non-root user; use --user root or add util-linux"; return; }
        fi
    fi
    [ "$pid_role" = control ] && pid_um=077   # pid's own outputs: for pid's eyes only
    umask "$pid_um"
    pid_setsid=$(command -v setsid) || pid_setsid=setsid
    if [ "$pid_role" = agent ] && [ "$pid_uid" != 0 ]; then
        pid_drop="$(command -v setpriv) --reuid=$pid_uid --regid=$pid_gid --clear-groups --inh-caps=-all --bounding-set=-all"
    fi
    [ "$pid_shell" = bash ] && pid_bash=$(command -v bash)
    pid_shbin=$(command -v "$pid_shell") || pid_shbin=$pid_shell
    cd /   # commands cd to the workdir themselves; a shell started in a directory since removed complains
    if [ "$pid_role" = agent ] && [ "$pid_shell" = bash ]; then
        rm -f "$pid_fifo.0" "$pid_fifo.1"
        if mkfifo -m 600 "$pid_fifo.0" "$pid_fifo.1" && exec 4<>"$pid_fifo.0" 5<>"$pid_fifo.1"; then
            pid_spawn 0
            pid_spawn 1
        else
            pid_fast=   # (no FIFOs, e.g. no inode left for them: commands start as on the sh path)
        fi
        rm -f "$pid_fifo.s" && mkfifo -m 600 "$pid_fifo.s" && exec 6<>"$pid_fifo.s" && pid_napfd=6
    fi
    pid_events
    echo "R $pid_shell $pid_pe"
}

pid_quit() {  # the host went away: the pre-started shells wait for commands that will never come
    for pid_pid in $pid_z0 $pid_z1; do kill -9 -"$pid_pid" 2>/dev/null || kill -9 "$pid_pid" 2>/dev/null; done
    rm -f "$pid_fifo.0" "$pid_fifo.1" "$pid_fifo.s" "$pid_mark"
    exit 0
}

pid_due=
while :; do
    pid_first=
    if [ -n "$pid_due" ]; then   # the first byte of the host's next request, or ~1 ms of quiet: see pid_refill
        IFS= read -r -t 0.001 -n 1 pid_first
        case $? in 0) ;; 1) break ;; *) pid_refill ;; esac
    fi
    IFS= read -r pid_line || break
    pid_line=$pid_first$pid_line
    set -- $pid_line
    case ${1:-} in
        x) pid_exec "$@" ;;
        y) pid_direct "$@" ;;
        w|W) pid_upload "$@" ;;
        c) pid_count "$@" ;;
        t) pid_tail "$@" ;;
        T) pid_trim "$@" ;;
        k) kill -9 -"$2" 2>/dev/null || kill -9 "$2" 2>/dev/null; pid_rc=$?; pid_untrace "$2"; echo "K $pid_rc" ;;
        K) pid_killuid ;;
        h) pid_hello ;;
        q) break ;;
        *) echo "E EPROTO" ;;
    esac
done
pid_quit
