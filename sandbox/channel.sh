# pid exec channel: a long-lived request/reply server on stdin/stdout, one per channel.
#
# Why a script and not `docker exec` per call: one exec costs ~60 ms; a request here costs about a millisecond.
# It runs in any image with /bin/sh and POSIX utilities; under bash it takes faster paths (printf -v, job
# control for process groups, a pre-started command shell). Per request it forks as little as possible:
# builtins do the bookkeeping.
#
# Installed as /tmp/.pid/channel.sh and run as `bash|sh channel.sh <channel id> <workdir>`.
# Nothing is written to stdout before the first request ("h"): the host reads the stream only after the HTTP
# upgrade, and output racing it could be lost.
#
# Requests are one line: an op letter and space separated fields. Free text fields (commands, paths, env
# snippets) are escaped by the host so that they hold no space, tab or newline: "\\" for a backslash and
# "\0ooo" (octal) for other bytes; `printf %b` decodes them without a fork. Raw data in replies is followed
# directly by "<nonce>", a random token of the request, so no content can fake the end of a reply. (bash
# flushes its stdout at every newline: each line is a write and a frame on the host's stream, so replies
# carry as few newlines of their own as possible.)
#   h                          -> "R <shell> <head-kind>"   (hello: prepares directories)
#   x <tail> <nonce> <env|-> <cmd>
#                              -> "P <pgid> <output-file>" when started; when it ends the first <tail>+1
#                                 bytes of its output (fewer: that is all of it), then "<nonce> <rc>\n"
#   c <tail> <nonce> <output-file>
#                              -> "C <newlines> <bytes>", its last <tail> bytes, "<nonce>\n"; the file is
#                                 kept (otherwise removed later)
#   r <max|-> <nonce> <path>   -> "E <errno-name>" | "D" line, the bytes, "<nonce> <rc>\n"
#   w <n> <path> + n raw bytes -> "E <errno-name>" | "W <rc>"   (copied by head: any size, any shell)
#   W <n> <path> + n bytes     -> same; bash only, small data: "\\" for a backslash and "\0000" for NUL, so
#                                 the shell reads and decodes it with builtins (read -N, printf %b)
#   t <offset> <max> <nonce> <path>
#                              -> "S <size>" line, bytes [max(offset, size-max), size), "<nonce>\n"
#   k <pgid>                   -> "K <rc>"  (SIGKILL the process group)
#   q                          -> exit
pid_cid=$1
pid_wd=$2
pid_dir=/tmp/.pid/out
pid_fifo=/tmp/.pid/cmd.$pid_cid
pid_n=0
pid_junk=
pid_junkn=0
pid_z=
pid_um=$(umask)
if [ -n "${BASH_VERSION:-}" ]; then
    pid_shell=bash
    set -m                      # async jobs get their own process group: the pgid we kill
    set -o pipefail
    pid_dec() { printf -v "$1" '%b' "$2"; }
else
    pid_shell=sh
    pid_dec() { eval "$1=\$(printf '%bX' \"\$2\")"; eval "$1=\${$1%X}"; }
fi
set -f                          # fields are split on spaces; never glob them

if head --version 2>/dev/null | grep -q GNU; then
    pid_head=gnu
    pid_take() { head -c "$1"; }                    # GNU head never reads past N bytes of a pipe
else
    pid_head=other
    pid_take() { dd bs=1 count="$1" 2>/dev/null; }  # slow but exact
fi

if [ "$pid_shell" = bash ]; then
    # The first $2 bytes of file $1, exactly, without a fork: bash's `read` reads regular files in blocks.
    # -d '' stops at each NUL byte (which a shell variable cannot hold) so NULs are written back one by one;
    # a file with many NULs is finished by head instead. Status: 0 end of file reached, 3 limit reached.
    pid_emit() {
        local LC_ALL=C pid_left=$2 pid_want pid_c pid_nuls=0
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
                return 3
            fi
        done <"$1" || return 1
        return 3
    }
else
    pid_emit() { head -c "$2" -- "$1"; }
fi

# bash: command shells are started ahead of time, blocked reading their command from a FIFO, so bash's
# ~1.5 ms start-up is off the request path. Two slots alternate, so back-to-back requests still find a shell
# that is up. Each is a fresh `bash` (own $$, no state of this server) in its own process group and evaluates
# the command as `bash -c` would. The server holds each slot's FIFO open read-write (fd 4, fd 5) for its whole
# life, so nothing blocks in open() and a command written before the shell is up waits in the FIFO.
# A command ends at a NUL byte, which no command can contain.
pid_zcode='IFS= read -r -d "" c <&3; exec 3<&-; umask "$1"; cd -- "$2" 2>/dev/null; set --; eval "unset c; $c"'
pid_slot=0
pid_z0=
pid_z1=
pid_spawn() {  # $1: slot
    pid_n=$((pid_n + 1))
    umask 077                   # the output file is 0600; the command gets the normal umask back
    if [ "$1" = 0 ]; then
        bash -c "$pid_zcode" bash "$pid_um" "$pid_wd" >"$pid_dir/$pid_cid.$pid_n" 2>&1 </dev/null 3<&4 4>&- 5>&- &
        pid_z0=$!
        pid_zo0=$pid_dir/$pid_cid.$pid_n
    else
        bash -c "$pid_zcode" bash "$pid_um" "$pid_wd" >"$pid_dir/$pid_cid.$pid_n" 2>&1 </dev/null 3<&5 4>&- 5>&- &
        pid_z1=$!
        pid_zo1=$pid_dir/$pid_cid.$pid_n
    fi
    umask "$pid_um"
}
pid_take_slot() {  # sets pid_pid/pid_out to the current slot's shell, starting one if it is gone
    if [ "$pid_slot" = 0 ]; then pid_pid=$pid_z0; else pid_pid=$pid_z1; fi
    if [ -z "$pid_pid" ] || ! kill -0 "$pid_pid"; then     # (stderr is /dev/null already: see channel.py)
        [ -n "$pid_pid" ] && wait "$pid_pid"
        pid_spawn "$pid_slot"
        if [ "$pid_slot" = 0 ]; then pid_pid=$pid_z0; else pid_pid=$pid_z1; fi
    fi
    if [ "$pid_slot" = 0 ]; then pid_out=$pid_zo0; else pid_out=$pid_zo1; fi
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

pid_exec() {  # x tail nonce env cmd
    pid_sweep
    pid_tb=$2
    pid_nonce=$3
    pid_dec pid_cmd "$5"
    pid_env=
    [ "$4" = - ] || pid_dec pid_env "$4"
    if [ "$pid_shell" = bash ]; then
        pid_take_slot
        [ -n "$pid_env" ] && pid_cmd="$pid_env
$pid_cmd"
        if [ "$pid_slot" = 0 ]; then
            printf '%s\0' "$pid_cmd" >&4
        else
            printf '%s\0' "$pid_cmd" >&5
        fi
    else
        pid_n=$((pid_n + 1))
        pid_out=$pid_dir/$pid_cid.$pid_n
        cd "$pid_wd" 2>/dev/null
        umask 077
        ( umask "$pid_um"; eval "$pid_env"; exec setsid sh -c "$pid_cmd" ) </dev/null >"$pid_out" 2>&1 &
        pid_pid=$!
        umask "$pid_um"
    fi
    echo "P $pid_pid $pid_out"
    wait "$pid_pid"
    pid_rc=$?
    [ -s "$pid_out" ] && pid_emit "$pid_out" $((pid_tb + 1))
    echo "$pid_nonce $pid_rc"
    pid_forget "$pid_out"
    if [ "$pid_shell" = bash ]; then
        pid_spawn "$pid_slot"
        pid_slot=$((1 - pid_slot))
    fi
}

pid_count() {  # c tail nonce path
    pid_dec pid_p "$4"
    pid_tb=$2
    pid_nonce=$3
    set -- $(wc -l -c <"$pid_p" 2>/dev/null)
    echo "C ${1:-0} ${2:-0}"
    tail -c "$pid_tb" "$pid_p"
    echo "$pid_nonce"
    case $pid_junk in
        *" $pid_p")
            pid_junk=${pid_junk%" $pid_p"}
            pid_junkn=$((pid_junkn - 1))
            ;;
    esac
}

pid_read() {  # r max nonce path
    pid_dec pid_p "$4"
    if [ -d "$pid_p" ]; then echo "E EISDIR"; return; fi
    if [ ! -e "$pid_p" ]; then echo "E ENOENT"; return; fi
    if [ ! -r "$pid_p" ]; then echo "E EACCES"; return; fi
    if [ ! -f "$pid_p" ]; then echo "E EINVAL"; return; fi   # a FIFO or device would block the channel
    echo D
    if [ "$2" != - ]; then
        pid_emit "$pid_p" "$2"
        pid_rc=$?
        [ "$pid_rc" = 3 ] && pid_rc=0
    elif [ "$pid_shell" = bash ]; then
        pid_emit "$pid_p" 1048576
        pid_rc=$?
        if [ "$pid_rc" = 3 ]; then
            tail -c +1048577 -- "$pid_p"
            pid_rc=$?
        fi
    else
        cat -- "$pid_p"
        pid_rc=$?
    fi
    echo "$3 $pid_rc"
}

pid_write() {  # w|W n path, then n bytes on stdin
    pid_dec pid_p "$3"
    pid_err=
    case $pid_p in
        */*) pid_d=${pid_p%/*} ;;
        *) pid_d=. ;;
    esac
    if [ -n "$pid_d" ] && [ ! -d "$pid_d" ]; then
        mkdir -p -- "$pid_d" 2>/dev/null || pid_err=ENOTDIR
    fi
    if [ -z "$pid_err" ] && [ -d "$pid_p" ]; then pid_err=EISDIR; fi
    if [ -z "$pid_err" ] && [ -e "$pid_p" ] && [ ! -f "$pid_p" ]; then pid_err=EINVAL; fi
    pid_rc=0
    if [ "$1" = W ]; then
        # Encoded data, read in bulk (read -N on a pipe reads blocks, -n would read byte by byte) and
        # decoded by printf %b: no fork. The file is opened once; an open that fails leaves pid_open unset.
        pid_data=
        [ "$2" -gt 0 ] && { IFS= LC_ALL=C read -r -N "$2" pid_data || pid_rc=1; }
        if [ -z "$pid_err" ]; then
            pid_open=
            { pid_open=1; [ -z "$pid_data" ] || printf '%b' "$pid_data" || pid_rc=1; } 2>/dev/null >"$pid_p"
            [ -n "$pid_open" ] || pid_err=EACCES
        fi
        pid_data=
    else
        if [ -z "$pid_err" ] && ! true 2>/dev/null >"$pid_p"; then pid_err=EACCES; fi
        if [ "$2" -gt 0 ]; then
            if [ -n "$pid_err" ]; then
                pid_take "$2" >/dev/null
            else
                pid_take "$2" >"$pid_p"
            fi
            pid_rc=$?
        fi
    fi
    if [ -n "$pid_err" ]; then echo "E $pid_err"; else echo "W $pid_rc"; fi
}

pid_tail() {  # t offset max nonce path: output appended since offset, at most the last max bytes of it
    pid_dec pid_p "$5"
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

while IFS= read -r pid_line; do
    set -- $pid_line
    case ${1:-} in
        x) pid_exec "$@" ;;
        c) pid_count "$@" ;;
        r) pid_read "$@" ;;
        w|W) pid_write "$@" ;;
        t) pid_tail "$@" ;;
        k) kill -9 -"$2" 2>/dev/null || kill -9 "$2" 2>/dev/null; echo "K $?" ;;
        h)
            [ -d "$pid_dir" ] || mkdir -p "$pid_dir" 2>/dev/null
            chmod 700 /tmp/.pid "$pid_dir" 2>/dev/null
            [ -d "$pid_wd" ] || mkdir -p "$pid_wd" 2>/dev/null
            cd "$pid_wd" 2>/dev/null
            if [ "$pid_shell" = bash ]; then
                rm -f "$pid_fifo.0" "$pid_fifo.1"
                mkfifo -m 600 "$pid_fifo.0" "$pid_fifo.1" && exec 4<>"$pid_fifo.0" 5<>"$pid_fifo.1" &&
                    pid_spawn 0 && pid_spawn 1
            fi
            echo "R $pid_shell $pid_head"
            ;;
        q) break ;;
        *) echo "E EPROTO" ;;
    esac
done
# The host went away: the pre-started shells wait for commands that will never come.
for pid_pid in $pid_z0 $pid_z1; do kill -9 "$pid_pid" 2>/dev/null; done
rm -f "$pid_fifo.0" "$pid_fifo.1"
