# The greeting (h), sourced by channel.sh, whose top says the protocol: pid's set-up of /.pid and of this server,
# once per server. The first control server greeted makes the directories, and the first server that needs to
# tries pid's privilege drop, before the agent runs anything (set_up, drop_runs: root's control part; a server
# greeted later reads what they left); every server then chooses how it starts the agent's commands (DROP).
#  - Privilege drop: every agent command, and every file read or write the tools make, runs through pid's drop
#    (/.pid/drop, sandbox/drop.c: a few system calls) or else the image's `setpriv`, as the agent's uid and gid, no
#    supplementary groups, no capabilities at all; no-new-privileges on the container keeps set-uid binaries from
#    bringing any back. It runs in its own process group (the kill target) from a fixed PATH.
#  - Who can write where: the server's FIFOs are in /.pid/run (0700, root), command outputs in /.pid/out (0711: the
#    agent can read a file whose name it is told, never list, create or replace one). With a job disk both live on
#    pid's own disk, so filling the job's disk cannot stop an output from being written.
DROPBIN=/.pid/drop   # pid's own privilege drop (sandbox/drop.c), put here by the host where it could build one
DROPOK=/.pid/run/drop.ok   # whether it runs here (drop_runs)
ZYGOTE=/.pid/zygote.so   # its zygote's half (drop.c), put beside it
SET_UP=/.pid/run/set-up   # the container's directories were made (set_up)
NOSETPRIV="the image has no setpriv (util-linux), needed to run commands as a non-root user; use --user root or add\
 util-linux"

op_hello() {  # h nonce [o]: set up /.pid (control) and this server (both)
    local nonce="$2"
    case ${3-} in '') ;; o) HOSTOUT=1 SWEEP_AT=1 ;; *) refuse "$nonce" ;; esac
    umask 077
    [ -d /.pid/run ] || mkdir -p /.pid/run /.pid/out || { say F "$nonce" "cannot create /.pid"; return; }
    SHBIN=$(command -v "$SHELL_") || SHBIN=$SHELL_
    if [ "$ROLE" = control ]; then
        set_up || { say F "$nonce" "$WHY"; return; }
        [ "$UID_" = 0 ] || command -v setpriv >/dev/null 2>&1 || drop_runs || { say F "$nonce" "$NOSETPRIV"; return; }
        UMASK=077   # pid's own outputs: for pid's eyes only
    fi
    umask "$UMASK"
    SETSID=$(command -v setsid) || SETSID=setsid
    cd /   # commands cd to the workdir themselves; a shell started in a directory since removed complains
    if [ "$ROLE" != agent ] || [ "$UID_" = 0 ]; then :
    elif drop_runs; then DROP="$DROPBIN $UID_ $GID_"   # (it runs the program as named: SHBIN is absolute)
    elif command -v setpriv >/dev/null 2>&1; then
        DROP="$(command -v setpriv) --reuid=$UID_ --regid=$GID_ --clear-groups --inh-caps=-all --bounding-set=-all"
    else say F "$nonce" "$NOSETPRIV"; return
    fi
    hello_more
    events
    say R "$nonce" "" "$SHELL_" "$PE"
}
hello_more() {  # (bash; sh has none) the slot FIFOs and shells (channel.sh: SLOT_SHELL, spawner); without them (no
    # inode left) commands start as on the sh path
    SETSID=   # (job control makes each command a process group leader already: setsid would fork)
    [ "$ROLE" = agent ] || return 0
    local f
    for f in "$FIFO.0" "$FIFO.1" "$FIFO.s"; do   # (none, but for a server greeted twice: then all go)
        [ ! -e "$f" ] && [ ! -L "$f" ] || { rm -f "$FIFO.0" "$FIFO.1" "$FIFO.s"; break; }
    done
    mkfifo -m 600 "$FIFO.0" "$FIFO.1" "$FIFO.s"   # (one process for the three; what it made is looked at)
    [ -p "$FIFO.0" ] && [ -p "$FIFO.1" ] && exec 4<>"$FIFO.0" 5<>"$FIFO.1" && SLOTS=1 && spawner && spawn 0 && spawn 1
    [ -p "$FIFO.s" ] && exec 6<>"$FIFO.s" || nap() { sleep 0.01; }
}
set_up() {  # the container's directories, by the first control server greeted, before the agent runs anything. A
    # control server greeted later (one aside, one replacing a dead one) leaves them: by then the agent may have
    # swapped the workdir (its own tree's, under --workdir) or the home for a link to /.pid, and a chown through it
    # gave the agent pid's files (root). The mark that it was done is root's, in /.pid/run. WHY <- what failed.
    [ ! -e "$SET_UP" ] || return 0
    WHY="cannot set up /.pid"
    chmod 711 /.pid /.pid/out && chmod 700 /.pid/run || return 1
    WHY="cannot create $WD"   # (a job's disk has them all but an image's workdir: each tool forks, none for nothing)
    [ -d /.pid/git ] && [ -d "$WD" ] || mkdir -p /.pid/git "$WD" || return 1
    set -- "$WD"
    if [ -n "${HOME:-}" ]; then   # (a home it cannot make or own is no failure)
        [ -d "$HOME" ] || mkdir -p "$HOME"
        [ ! -d "$HOME" ] || set -- "$WD" "$HOME"
    fi
    chown "$UID_:$GID_" "$@" || chown "$UID_:$GID_" "$WD" || return 1
    WHY="cannot set up /.pid"
    true >"$SET_UP"
}
drop_runs() {  # pid's drop is here and works: one built for another architecture than the engine's does not run,
    # nor one a security module refuses (setpriv drops then). Tried once, by the first server to greet, before the
    # agent runs anything (the servers that start with the container); the answer is kept in /.pid/run (root's), so
    # a server greeted later, with the agent about, runs nothing of the agent's uid here.
    local ok=
    [ -x "$DROPBIN" ] || return 1
    [ ! -f "$DROPOK" ] || read -r ok <"$DROPOK"   # (a regular file: bash reads it by lines, nothing left over)
    if [ -z "$ok" ]; then
        ok=0
        "$DROPBIN" "$UID_" "$GID_" "$SHBIN" -c : </dev/null >/dev/null 2>&1 3>&- 4>&- 5>&- 6>&- && ok=1
        echo "$ok" >"$DROPOK"
    fi
    [ "$ok" = 1 ]
}
