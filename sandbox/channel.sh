# pid exec channel server: requests on stdin, replies on stdout, one request at a time. Runs as root, as `bash|sh
# channel.sh <role> <channel id> <workdir> <uid> <gid>` (channel.py: `docker exec`, or two FIFOs of /.pid/run that the
# container's entry opens). Why a server: one `docker exec` costs ~60 ms, a request ~1 ms. This file is what a bash
# call goes through: the protocol, the run op, the pre-started shells. Beside it in /.pid, root's and read-only:
# channel_hello.sh, the greeting (h: the set-up of /.pid, of the privilege drop and of the slot shells, before the
# agent runs anything), channel_ops.sh, the requests on outputs and processes (c t T k K), channel_sh.sh, what a
# /bin/sh without bash uses where bash has builtins, and drop (drop.c), pid's privilege drop, which also forks the
# slot shells. All but the bash part need a /bin/sh with `local`, which POSIX lacks (dash and busybox ash have it).
#
# THE PROTOCOL (the only one; channel.py reads every reply with one reader, Channel._reply):
#   request: "<op> <nonce> <numbers...> [<output file>]", padded with spaces to 127 bytes, and "\n" (exactly: bash
#            reads it in one read, REQUEST_HEADER), then, for r, <cmdlen> bytes of command, <datalen> of data.
#   reply:   "<TAG> <nonce> <fields...> <len>\n" then exactly <len> bytes of payload.
#   The nonce is the request's (random, fresh per request): a reply is taken only for the request that asked, and
#   its payload is counted, never searched for an end mark, so no byte of the agent's output can end or fake a reply.
#   h n [o]                  -> R n <shell> <refused forks> 0              | F n <len> + why the sandbox cannot work
#                               o: the host removes the outputs of the commands it runs here (it holds pid's disk):
#                               this server then never removes one, which the host may not yet hold (outputs.py)
#   r n <emit> <slot|-> <cmdlen> <datalen|->  + command + data (the data is stored in a file passed as "$1")
#                            -> P n <pgid> <output file> 0 when started (B n 0: the process table is full, nothing ran)
#                               then D n <status> <refused forks> <len> + the first <emit> bytes of its output.
#                               <slot>: the host already wrote "<cmdlen>\n<command>" into that slot shell's FIFO.
#   c n <tail> <output file> -> C n <newlines> <bytes> <bytes cut> <len> + its last <tail> bytes (the file is kept)
#   t n <from> <max> <file>  -> S n <size> <len> + bytes [max(from, size - max), size)
#   T n <keep> <file>        -> T n <bytes cut> 0   (all but ~<keep> bytes of a running command's output become a hole)
#   k n <pgid>               -> K n <status> 0      (SIGKILL the group: a builtin, works with the process table full)
#   K n                      -> K n <killed> <refused forks> <left> 0   (SIGKILL every process of the agent's uid;
#                               <left>: found in the last pass, some may have outrun it)
#   q n                      -> the server ends (as at EOF). Anything else: E n 0, and it ends too (out of step).
# The only paths in requests are output files this server reported (/.pid/out/<id>.<n>), which the host checks.
#
# TRUST. This server and its files are pid's; the commands it starts are the agent's (a root agent, `--user root`,
# shares pid's uid: then none of this holds, and the host still bounds every reply in bytes and time).
#  - The privilege drop, and who can write where (/.pid, its FIFOs and outputs): channel_hello.sh, which sets them up.
#    A slot shell's FIFO gets bytes from pid alone: each shell opens it read-only, as root, before it drops to the
#    agent (see SLOT_SHELL).
#  - Bounded reads: the host bounds every reply; here, bash's `read` builtin shares one read-ahead buffer between all
#    descriptors, so bytes left in it by a read of a file (or a timed-out read of a FIFO) would be taken as the next
#    request. Files are therefore read by count (`read -N` in slurp, `read -d '' -n` in say_head: unbuffered, never
#    past what is asked for); a timed-out read is followed by emptying that buffer (drain). Bytes, not characters (C).
#  - Nothing the agent starts may make this server hang: a full process table is detected before a command's fork
#    (B), a tracer that holds a slot shell is killed (untrace), and a command the host stopped sending never runs.
#    Replies copied through head (c, t, an output with NUL bytes) fork: with the table full one may come short, and
#    the host, which counts every reply, drops that channel.
exec 2>/dev/null   # (as its boot has it: only replies reach the host; no kill or read needs a redirection of its own)
pid_opath=${PID_IMAGE_PATH:-/usr/local/bin:/usr/bin:/bin}   # the image's PATH, for the agent's commands alone
unset PID_IMAGE_PATH
PATH=/usr/sbin:/usr/bin:/sbin:/bin   # pid's: root-owned system directories only
export PATH
ROLE=$1 CID=$2 WD=$3 UID_=$4 GID_=$5
OUT=/.pid/out
FIFO=/.pid/run/cmd.$CID
MARK=/.pid/run/mark.$CID
N=0            # output files made so far (<id>.<n>)
JUNK= JUNKN=0  # files nobody needs any more (outputs, uploaded data, long commands), removed SWEEP_AT at a time
SWEEP_AT=32    # (one rm, not one per request)
HOSTOUT=       # the host removes the commands' outputs (op_hello): JUNK holds only the rarer others (gone sooner)
UMASK=022
DROP=          # for an agent that is not root (set in op_hello): "/.pid/drop <uid> <gid>", else "setpriv ..."
SETSID=setsid SHBIN=sh SHELL_=sh   # how a command's shell starts (set in op_hello)
CG= PMAX=      # the container's pids cgroup, and its limit (fixed for the container's life; empty: none)
set -f         # fields are split on spaces, never globbed
for d in /sys/fs/cgroup/pids /sys/fs/cgroup; do [ -r "$d/pids.max" ] && { CG=$d; break; }; done
[ -z "$CG" ] || read -r PMAX <"$CG/pids.max"
case $PMAX in ''|*[!0-9]*) PMAX= ;; esac
DIRECT_MAX=4000   # at most one page ever goes into a slot's FIFO (channel.py: DIRECT_MAX); see SLOT_SHELL
REQUEST_HEADER=128   # a request's first line, its newline last and alone (channel.py: REQUEST_HEADER); see request
SLOTS=         # bash agent servers: commands run on two pre-started slot shells (see SLOT_SHELL)
DUE=           # (bash) a used slot's successor is still to be started
UNMADE="pid: the command could not start: its output file could not be made (no space or no inodes left for output)"

# --- helpers shared by both servers (POSIX sh, and `local`) --------------------------------------------------------
digits() {  # true when every argument is a non-empty decimal number (no field reaches $((...)) otherwise)
    local a; for a in "$@"; do case $a in ''|*[!0-9]*) return 1 ;; esac; done; }
# (A cgroup file is read by lines: it can always seek back, so bash's buffer keeps nothing of it; see slurp.)
events() {  # PE <- forks the pids limit refused so far, "max <n>" (0 when the cgroup does not say)
    PE=0; [ -z "$CG" ] || read -r _ PE <"$CG/pids.events"
    case $PE in ''|*[!0-9]*) PE=0 ;; esac
}
table_full() {  # true when the process table is (nearly) full: a fork now would hang (processes.py: TABLE_MARGIN)
    local cur; [ -n "$PMAX" ] && read -r cur <"$CG/pids.current" || return 1
    case $cur in ''|*[!0-9]*) return 1 ;; esac
    [ $((cur + 8)) -ge "$PMAX" ]
}
forget() { JUNK="$JUNK $1"; JUNKN=$((JUNKN + 1)); }
sweep() { rm -f $JUNK; JUNK=; JUNKN=0; }
take() { if [ "$GNUHEAD" = 1 ]; then head -c "$1"; else dd bs=1 count="$1"; fi; }   # exactly $1 bytes (headkind first)
headkind() { [ -n "$GNUHEAD" ] || case $(head --version </dev/null) in *GNU*) GNUHEAD=1 ;; *) GNUHEAD=0 ;; esac; }
GNUHEAD=   # (GNU head reads no more than N bytes; asked once, when first needed: it forks)
case $0 in /*) HERE=${0%/*} ;; *) exit 1 ;; esac   # pid's own files beside this one (/.pid: root's, read-only)
. "$HERE/channel_hello.sh" || exit 1   # the greeting: h
. "$HERE/channel_ops.sh" || exit 1   # the requests on outputs and processes: c t T k K

# A command's background processes may still write just after it ended ("(sleep .05; echo x) &"); pi reads on
# while its pipe has writers, until they are quiet for 100 ms. Here: while processes of its group are left and one
# of the agent's holds the output open (looked for as the agent: pid may not look into the agent's /proc entries),
# wait until they are gone or the file went unwritten for ~100 ms, 1 s at most (never with the table full).
SCAN='set +f; for f in /proc/[0-9]*/fd/*; do [ "$f" -ef "$1" ] && exit 0; done; exit 1'
linger() {  # $1 pgid, $2 output file
    local quiet=0 ticks=0 scan
    ! table_full || return 0
    # (in the background: a scan the agent stops ends bash's wait too, and is then killed, not kept; only while it
    # is this server's child, stopped: a number already reaped may be another process's)
    PATH=$pid_opath $DROP $SHBIN -c "$SCAN" pid-scan "$2" </dev/null >/dev/null 2>&1 4>&- 5>&- 6>&- &
    scan=$!
    wait "$scan" || {
        field "/proc/$scan" PPid
        case $FS:$FV in [Tt]:"$$") kill -9 "$scan"; wait "$scan" ;; esac
        disown "$scan"
        return 0
    }
    disown "$scan"
    true >"$MARK"   # (not `:`: a failed redirection on a special builtin ends dash)
    while [ "$quiet" -lt 10 ] && [ "$ticks" -lt 100 ] && kill -0 -"$1" && ! table_full; do
        nap
        if [ "$2" -nt "$MARK" ]; then quiet=0; true >"$MARK"; else quiet=$((quiet + 1)); fi
        ticks=$((ticks + 1))
    done
}
store() {  # $1 datalen: the data that follows the command, into a file of root's that the command gets as "$1";
    # STORED <- its name, or empty when it could not be made (every byte still leaves stdin: left there, they would
    # be read as pid's requests)
    N=$((N + 1))
    STORED=$OUT/$CID.$N.in
    forget "$STORED"
    headkind
    take "$1" | { cat >"$STORED" || { cat >/dev/null; exit 1; }; } || STORED=
}
with_data() {  # CMD <- CMD with "$1" set to the stored data (after its "#pid:anywhere" first line, if any)
    [ -n "$STORED" ] || { CMD="#pid:anywhere
echo 'pid: the uploaded data could not be stored (no space or no inodes left for it)' >&2; exit 95"; return; }
    case $CMD in
        "#pid:anywhere
"*) CMD="#pid:anywhere
set -- $STORED
${CMD#*
}" ;;
        *) CMD="set -- $STORED
$CMD" ;;
    esac
}
# A command needs the working directory (pi's bash refuses to run without it): when it is gone the command is not
# run, its output is pi's message and its status 212; pid's own file snippets (absolute paths) start with the line
# "#pid:anywhere" and run anyway.
nowd() {
    case $CMD in "#pid:anywhere"*) ;; *)
        printf 'Working directory does not exist: %s\nCannot execute bash commands.' "$WD"; exit 212 ;; esac
}
start_plain() {  # CMD -> PID, POUT: a new shell for it (control: as root, clean environment; agent: dropped)
    N=$((N + 1))
    POUT=$OUT/$CID.$N
    if [ "$ROLE" = control ]; then
        ( cd / && exec env -i PATH="$PATH" HOME=/.pid LC_ALL=C $SETSID "$SHBIN" -c "$CMD" ) </dev/null >"$POUT" 2>&1 &
    else   # (the image's variables come back in the agent's command alone: image_env.py)
        ( cd "$WD" 2>/dev/null || nowd; PATH=$pid_opath; [ -z "${PID_IMAGE_ENV-}" ] ||
          CMD="eval \"\$PID_IMAGE_ENV\"; unset PID_IMAGE_ENV; $CMD"   # (one line: the command's are numbered from 1)
          exec $DROP $SETSID "$SHBIN" -c "$CMD" "$SHELL_" ) </dev/null >"$POUT" 2>&1 &
    fi
    PID=$!
}
finish() {  # $1 nonce, $2 emit: wait for PID, then reply D with the head of POUT and the status
    local rc
    reap "$PID"
    rc=$RC
    # a stopped shell (wait returns then, 128 + the signal) goes now, not to take a later command (if still ours)
    ! kill -0 "$PID" || ! ours "$PID" || { kill -9 "$PID"; untrace "$PID"; reap "$PID"; }
    # Its job (if it is bash's) leaves bash's table before its group is looked at: bash 5.2 keeps a dead job there for
    # good once a `kill -0 -<its pgid>` finds it; the table, ~300 bytes more per command, is scanned at every fork.
    [ -n "$SPW" ] || disown "$PID"
    [ "$ROLE" != agent ] || ! kill -0 -"$PID" || linger "$PID" "$POUT"   # processes of its group are left
    events
    if [ -e "$POUT" ]; then say_head D "$1" "$POUT" "$2" "$rc" "$PE"
    else say D "$1" "$(printf '%s' "$UNMADE" | head -c "$2")" 126 "$PE"; fi   # no shell ran (see UNMADE)
    [ -n "$HOSTOUT" ] || forget "$POUT"
    [ -z "$SLOTS" ] || slot_done
}
op_run() {  # r nonce emit slot cmdlen datalen
    local nonce="$2" emit="$3" slot="$4" cmdlen="$5" data="$6"
    case $emit$cmdlen in *[!0-9]*) false ;; esac && [ -n "$emit" ] && [ -n "$cmdlen" ] &&
        case $slot in -) ;; 0|1) [ -n "$SLOTS" ] && [ "$cmdlen" -le "$DIRECT_MAX" ] ;; *) false ;; esac &&
        case $data in -) ;; *) digits "$data" ;; esac || refuse "$nonce"
    [ "$JUNKN" -lt "$SWEEP_AT" ] || sweep
    readcmd "$cmdlen"
    [ -n "$CMD" ] || CMD=:
    [ "$data" = - ] || { store "$data"; with_data; }
    if [ "$slot" != - ]; then   # the host wrote it into that slot's FIFO itself: its shell may be running it
        handed "$slot" || { say B "$nonce" ""; return; }
    else
        if [ "$ROLE" = agent ] && table_full; then say B "$nonce" ""; return; fi
        # The host sends nothing more until it has the "P" line: anything to read now is its EOF. It gave up on
        # this request (its deadline passed, or it stopped sending half-way): nothing of it may run.
        host_gone && quit
        if [ -z "$SLOTS" ]; then start_plain; elif ready "$SLOT"; then hand "$SLOT"; else say B "$nonce" ""; return; fi
    fi
    say P "$nonce" "" "$PID" "$POUT"
    [ -z "$DUE" ] || refill
    finish "$nonce" "$emit"
}
refuse() { say E "$1" ""; quit; }   # not understood: the stream is out of step (a refused r's body is unread)
serve() {  # one request at a time until EOF or q
    while :; do
        FIRST=
        idle || break
        request || break
        set -- $FIRST$LINE
        case ${1:-} in
            r) op_run "$@" ;;
            c) op_count "$@" ;;
            t) op_tail "$@" ;;
            T) op_trim "$@" ;;
            k) op_kill "$@" ;;
            K) op_killall "$@" ;;
            h) op_hello "$@" ;;
            q) break ;;
            *) refuse "${2:-}" ;;
        esac
    done
    quit
}

# POSIX sh ends here, in the functions it has for what bash does below with builtins; nothing below is parsed by it.
[ -n "${BASH_VERSION:-}" ] || { . "$HERE/channel_sh.sh" || exit 1; serve; }

# --- bash: the same server, with pre-started shells and builtins where sh forks ------------------------------------
SHELL_=bash
set -m         # async jobs get their own process group: the pgid the host kills
LCALL=${LC_ALL:-}   # the image's, for the agent's shells; the server itself counts bytes, in C (not exported)
export -n LC_ALL
LC_ALL=C
LF='
'
Z=("" "") ZO=("" "") ZP=("" "") SPR= SPW=   # each slot's waiting shell, its output and parent; the spawner's pipes
SLOT=0         # the slot the next command runs on (they alternate: the other shell is up meanwhile)

slurp() {  # S <- file $1, whole: `read -N` never reads past what it asks for, so nothing stays in bash's buffer
    S=
    IFS= read -r -N 16384 S <"$1"
}
field() {  # FV <- the first number of field $2 ("Uid") in process directory $1's status, FS <- its state's letter
    local s
    FV= FS=
    slurp "$1/status"
    case $S in *"$LF$2:"*) s=${S#*"$LF$2:"}; s=${s#"${s%%[0-9]*}"}; FV=${s%%[!0-9]*} ;; esac
    case $S in *"${LF}State:"*) s=${S#*"${LF}State:"}; s=${s#"${s%%[A-Za-z]*}"}; FS=${s:0:1} ;; esac
    S=
}
nap() { IFS= read -r -t 0.01 -u 6 _; }   # ~10 ms without a fork: a read that times out on the server's own FIFO
readcmd() {  # (stdin is a pipe or socket: bash reads no further)
    CMD=; [ "$1" = 0 ] || IFS= read -r -N "$1" CMD; [ "${#CMD}" -eq "$1" ] || quit
}
host_gone() { read -r -t 0; }
request() {  # LINE <- the rest of a request's first line, read at once; a line out of step is refused (op "-")
    IFS= read -r -N $((REQUEST_HEADER - ${#FIRST})) LINE || return 1
    case $FIRST${LINE%"$LF"} in *"$LF"*) LINE=- FIRST= ;; esac
    case $LINE in *"$LF") ;; *) LINE=- FIRST= ;; esac
}
say() { printf '%s %s%s %d\n%s' "$1" "$2" "${4+ ${*:4}}" "${#3}" "$3"; }   # tag, nonce, payload (no NUL), fields
say_head() {  # $1 tag, $2 nonce, $3 file, $4 max, then the fields: the file's first <max> bytes, in one read
    # without a fork; a read stops early at a NUL byte, which a variable cannot hold: then a copy through head
    local c=
    if [ -s "$3" ] && IFS= read -r -d '' -n "$4" c <"$3" && [ "${#c}" -lt "$4" ]; then say_copy "$@"
    else say "$1" "$2" "$c" "${@:5}"; fi
}
# The slot shells. Each is started ahead of time (by pid's drop: spawner), already dropped to the agent, blocked
# reading its command from its FIFO, so that start-up is off the request path; two alternate, so back-to-back
# requests still find one up. Each is a fresh bash in its own process group that evaluates its command as `bash -c`
# would: the drop's zygote ($4 z, $5 its builtin: drop.c) forks them from a bash that never runs a command, after
# what is the same for every shell (the image's variables, umask, locale), and each then warms what its command's
# path touches (copy-on-write faults before the wait, not after); without it, the drop executes bash for each.
# Who can write its FIFO: the server holds both FIFOs read-write (fds 4, 5) for its life, so nothing blocks in
# open(); each shell gets its own opened anew, read-only, by root (fd 3): the agent, who may ptrace its own waiting
# shell, gets a descriptor that can neither write pid's FIFO nor change the flags of the server's open. It can
# shrink the pipe to one page, so no more than one page ever goes into a FIFO (an empty pipe takes it at once,
# stopped reader or not): a longer one goes through a file of root's ("<length> <file>"; cut short: not run, 125).
# Locale: the drop and bash start in C; the shell loads the agent's locale ($3: the image's LC_ALL, else its LANG)
# before it waits, reads the command in C (a byte count), and is back in the agent's locale before the command
# runs. The image's loader and shell variables come back here alone (image_env.py), BASH_ENV read as bash would.
# One line (line breaks become spaces): the command's lines are numbered from 1 as `bash -c` numbers them ($LINENO,
# "line 3: syntax error"), evaluated from where `bash -c` keeps it (BASH_EXECUTION_STRING), with no OLDPWD (`cd -`).
SLOT_SHELL='[ -z "${PID_IMAGE_ENV-}" ] || { eval "$PID_IMAGE_ENV"; unset PID_IMAGE_ENV; };
umask "$1"; if [ -n "$3" ]; then LC_ALL=$3; else unset LC_ALL; fi; LC_ALL=C;
[ -z "${4-}" ] || { enable -f "$5" zserve && zserve && enable -n zserve && SECONDS=0 && RANDOM=$((BASHPID ^ 1${EPOCHREALTIME//[!0-9]/})) && { cd -- "$2"; LC_ALL=$3; LC_ALL=C; eval :; } 2>/dev/null; } || exit 99;
set -- "$1" "$2" "$3"; [ ! -r "${BASH_ENV-}" ] || . "$BASH_ENV" "$@";
read -r -u 3 n f && if [ -z "$f" ]; then IFS= read -r -N "$n" -u 3 c; else IFS= read -r -N "$n" c <"$f"; fi; exec 3<&-;
[ "${#c}" = "$n" ] || { printf "pid: the command reached its shell cut short (%s of %s bytes; is the job'"'"'s disk full?): not run" "${#c}" "$n"; exit 125; };
if [ -n "$3" ]; then LC_ALL=$3; else unset LC_ALL; fi; unset n f; cd -- "$2" 2>/dev/null || case $c in "#pid:anywhere"*) ;; *)
printf "Working directory does not exist: %s\nCannot execute bash commands." "$2"; exit 212 ;; esac; unset OLDPWD; export OLDPWD; set --;
BASH_EXECUTION_STRING=$c; export -n BASH_EXECUTION_STRING; unset c; eval "$BASH_EXECUTION_STRING"'
SLOT_SHELL=${SLOT_SHELL//"$LF"/ }

spawn() {  # $1 slot: a new waiting shell (its output file is made now, by root); false: no fork (table full)
    N=$((N + 1))
    ZO[$1]=$OUT/$CID.$N
    [ -z "$SPW" ] || { ask s "/proc/$$/fd/$((4 + $1))" "${ZO[$1]}"; Z[$1]=${R##-*} ZP[$1]=$RP; [ -n "${Z[$1]}" ]; return; }
    LC_ALL=C PATH=$pid_opath $DROP $SHBIN -c "$SLOT_SHELL" bash "$UMASK" "$WD" "$LCALL" >"${ZO[$1]}" 2>&1 </dev/null \
        3<"/proc/self/fd/$((4 + $1))" 4>&- 5>&- 6>&- &
    Z[$1]=$! ZP[$1]=$$
}
spawner() {  # where the drop is pid's own, it forks the slot shells (drop.c, serve: a fork of this server cost ~170
    # page faults a command); their ends then come from it (reap, ask), and alive knows it for their parent
    local i=   # (greeted again: the first shells go, their FIFOs are no more)
    [ -z "$SPW" ] || for i in 0 1; do
        [ -z "${Z[$i]}" ] || { ! ours "${Z[$i]}" "$i" || kill -9 "${Z[$i]}"; reap "${Z[$i]}"; Z[$i]=; }
    done
    [ "${DROP%% *}" = "$DROPBIN" ] && [ -z "$SPW" ] || return 0
    [ ! -s "$ZYGOTE" ] || i="-z $ZYGOTE"   # (its zygote: drop.c)
    coproc SPAWNER { LC_ALL=C PATH=$pid_opath exec $DROP -s $i $SHBIN -c "$SLOT_SHELL" bash "$UMASK" "$WD" "$LCALL"; }
    SPR=${SPAWNER[0]} SPW=${SPAWNER[1]}
}
ask() { printf '%s %s\n' "$1" "${*:2}" >&"$SPW"; IFS= read -r -N 16 -u "$SPR" R || quit; set -- $R; R=$1 RP=${2-}; }
reap() { if [ -n "$SPW" ]; then ask w "$1"; RC=$R; else wait "$1"; RC=$?; fi; }   # RC <- slot shell $1's wait status
drain() {  # $1 slot: a shell killed before it read all of its command left the rest in its FIFO; the next shell
    # must not take it for its own. (pid's bytes only, a page at most; 64 reads is a safety bound.)
    local fd=$((4 + $1)) i=0 junk
    read -r -t 0 -u "$fd" || return 0
    while [ "$i" -lt 64 ] && read -r -t 0 -u "$fd"; do
        IFS= read -r -d '' -t 0.01 -N 65536 -u "$fd" junk
        i=$((i + 1))
    done
    mapfile junk </dev/null   # a timed-out `read -N` leaves its bytes in bash's shared buffer: mapfile empties it
}
ours() {  # $1 pid [$2 slot]: still that slot's shell, child of its parent (not reaped, reused, orphaned); ST <- stat
    [ -n "$SLOTS" ] || return 0   # (the server's own child: its number is taken until the server reaps it)
    slurp "/proc/$1/stat"; ST=(${S##*) }); S=   # (numbers and one letter: nothing to glob)
    [ "${ST[1]:-}" = "${ZP[${2:-$SLOT}]}" ]
}
alive() {  # whether slot $1's shell can still take a command. kill -0 passes a shell that is killed but not dead yet
    # (a frozen container's SIGKILL waits for the thaw) or not reaped: /proc/<pid>/stat says so (fields 3, 9, 31:
    # state, flags, pending signals: a zombie, PF_EXITING or PF_SIGNALED, a SIGKILL on its way). A shell stopped by a
    # tracer (state t) is killed here, and the tracer of it or of a zombie too: the caller then waits for it.
    kill -0 "${Z[$1]}" && ours "${Z[$1]}" "$1" || return 1
    set -- "${Z[$1]}"
    case ${ST[0]:-Z} in [ZX]*) untrace "$1"; return 1 ;; t*) kill -9 "$1"; untrace "$1"; return 1 ;; esac
    [ $((${ST[6]:-0} & 0x404 | ${ST[28]:-0} & 256)) = 0 ]
}
ready() {  # $1 slot: PID <- its waiting shell, a new one if it is gone (what the old one left in the FIFO goes)
    if [ -z "${Z[$1]}" ] || ! alive "$1"; then
        [ -z "${Z[$1]}" ] || reap "${Z[$1]}"
        drain "$1"
        spawn "$1" || return 1
    fi
    PID=${Z[$1]} POUT=${ZO[$1]}
}
refill() {  # start the used slot's successor (a fork, the drop and bash: ~4 ms of CPU) while a command runs, or
    # after ~1 ms of quiet: not at once, a reply wakes the host's reader on this CPU
    DUE=
    table_full && return 0   # (ready starts it when it is needed and possible)
    [ -n "${Z[0]}" ] || spawn 0
    [ -n "${Z[1]}" ] || spawn 1
}
idle() {  # FIRST <- the first byte of the next request; if ~1 ms passes first, a used slot's successor starts and,
    # when the host removes the outputs (JUNK: only commands and uploads, done with), those files go (both fork: off
    # the next request's path, unless it comes at once). Otherwise JUNK holds outputs the host may still count (c).
    [ -n "$DUE" ] || { [ -n "$HOSTOUT" ] && [ -n "$JUNK" ]; } || return 0
    IFS= read -r -t 0.001 -n 1 FIRST
    case $? in 0) ;; 1) return 1 ;; *) [ -z "$DUE" ] || refill; [ -z "$HOSTOUT" ] || [ -z "$JUNK" ] || sweep ;; esac
}
hand() {  # $1 slot: CMD into its FIFO: up to a page itself, a longer one through a file of root's
    local file
    if [ "${#CMD}" -le "$DIRECT_MAX" ]; then
        printf '%s\n%s' "${#CMD}" "$CMD" >&$((4 + $1))
        return
    fi
    N=$((N + 1))
    file=$OUT/$CID.$N.cmd
    forget "$file"
    printf '%s' "$CMD" >"$file"
    printf '%s %s\n' "${#CMD}" "$file" >&$((4 + $1))
}
handed() {  # $1 slot, to whose FIFO the host wrote the command: PID <- the shell that runs it (false: the table
    # is full, nothing ran). A shell that died before it took the command (the agent's code killed it) ran none of
    # it: its remains are drained and a new shell gets the command. A slot with no shell yet gets one now. The FIFO
    # is looked at again once the shell is seen dead: before, a shell could take a quick command, run it and end in
    # between, and it ran twice.
    SLOT=$1
    if [ -z "${Z[$1]}" ]; then
        table_full && { drain "$1"; return 1; }
        spawn "$1" || { drain "$1"; return 1; }
    elif read -r -t 0 -u $((4 + $1)) && ! alive "$1" && read -r -t 0 -u $((4 + $1)); then
        reap "${Z[$1]}"
        drain "$1"
        Z[$1]=
        ! table_full && spawn "$1" || return 1
        hand "$1"
    fi
    PID=${Z[$1]} POUT=${ZO[$1]}
}
slot_done() {  # the slot's shell is reaped (its number may be reused): its successor starts in refill
    ! read -r -t 0 -u $((4 + SLOT)) || drain "$SLOT"   # (the usual case: nothing left)
    Z[$SLOT]=
    DUE=1
    SLOT=$((1 - SLOT))
}
quit() {  # the host went away: the waiting shells wait for commands that will never come
    local i
    for i in 0 1; do [ -z "${Z[$i]}" ] || ! ours "${Z[$i]}" "$i" || kill -9 -"${Z[$i]}" || kill -9 "${Z[$i]}"; done
    rm -f "$FIFO.0" "$FIFO.1" "$FIFO.s" "$MARK"
    exit 0
}
serve
