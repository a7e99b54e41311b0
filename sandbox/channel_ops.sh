# pid's requests on a command's output and on the agent's processes: sourced by channel.sh, whose top says the
# protocol and the trust argument. c, t and T read and trim an output file the server reported (the host checks
# every name against that; c and t reply with a copy of part of it, say_file); k and K kill. They run as root and run
# nothing of the agent's.

say_file() {  # $1 tag, $2 nonce, $3 file, $4 offset, $5 length, then the fields: exactly <length> bytes of the file
    # from <offset>, padded with NULs should it have shrunk meanwhile (a command may truncate its own output), so
    # that the length in the header is always what follows
    local tag="$1" nonce="$2" f="$3" from="$4" len="$5"
    shift 5
    printf '%s %s%s %d\n' "$tag" "$nonce" "${*:+ $*}" "$len"
    [ "$len" -gt 0 ] || return 0
    { tail -c +$((from + 1)) -- "$f" | head -c "$len"; head -c "$len" /dev/zero; } | head -c "$len"
}
say_copy() {  # $1 tag, $2 nonce, $3 file, $4 max, then the fields: the file's first <max> bytes, through head
    local tag="$1" nonce="$2" f="$3" max="$4"
    shift 4
    fsize "$f"
    [ "$SIZE" -le "$max" ] || SIZE=$max
    say_file "$tag" "$nonce" "$f" 0 "$SIZE" "$@"
}
fsize() { SIZE=$(wc -c <"$1") || SIZE=0; SIZE=$((SIZE + 0)); }
cutinfo() {  # CUT, CUTL <- bytes and newlines dropped from the front of output file $1 (output_trim.py, op_trim)
    CUT=0 CUTL=0
    [ -f "$1.cut" ] && read -r CUT CUTL <"$1.cut"
    digits "$CUT" "$CUTL" || { CUT=0; CUTL=0; }
}
op_count() {  # c nonce tail file
    local nonce="$2" tail="$3" f="$4" lines
    digits "$tail" || refuse "$nonce"
    cutinfo "$f"
    fsize "$f"
    if [ "$CUT" = 0 ]; then lines=$(wc -l <"$f")
    else lines=$(($(tail -c +$((CUT + 1)) -- "$f" | wc -l) + CUTL)); fi   # the front's were counted when cut
    [ "$tail" -le "$SIZE" ] || tail=$SIZE
    case $JUNK in *" $f") JUNK=${JUNK%" $f"}; JUNKN=$((JUNKN - 1)) ;; esac   # kept: the host reads it later
    say_file C "$nonce" "$f" $((SIZE - tail)) "$tail" $((lines + 0)) "$SIZE" "$CUT"
}
op_tail() {  # t nonce from max file
    local nonce="$2" from="$3" max="$4" f="$5"
    digits "$from" "$max" || refuse "$nonce"
    fsize "$f"
    [ "$SIZE" -gt "$from" ] || from=$SIZE
    [ $((SIZE - max)) -le "$from" ] || from=$((SIZE - max))
    say_file S "$nonce" "$f" "$from" $((SIZE - from)) "$SIZE"
}
op_trim() {  # T nonce keep file: the front becomes a hole (fallocate), its newlines are counted in <file>.cut
    local nonce="$2" keep="$3" f="$4" new nl
    digits "$keep" || refuse "$nonce"
    cutinfo "$f"
    fsize "$f"
    if [ $((SIZE - CUT)) -gt $((keep * 2)) ]; then
        new=$(((SIZE - keep) / 1048576 * 1048576))
        nl=$(tail -c +$((CUT + 1)) -- "$f" | head -c $((new - CUT)) | wc -l)
        if fallocate -p -o "$CUT" -l $((new - CUT)) "$f"; then
            CUT=$new CUTL=$((CUTL + nl))
            echo "$CUT $CUTL" >"$f.cut"
        fi
    fi
    say T "$nonce" "" "$CUT"
}
untrace() {  # ptrace is the agent's right over its own processes, pid's slot shells among them: a tracer that
    # stops a shell the server waits for would hang it. Such a tracer (a process of the agent's uid) is killed.
    local tp
    digits "$1" || return 0
    field "/proc/$1" TracerPid
    tp=$FV
    case $tp in ''|0|1|"$$") return 0 ;; esac
    field "/proc/$tp" Uid
    [ "$FV" = "$UID_" ] && kill -9 "$tp"
    return 0
}
op_kill() {  # k nonce pgid; no such group: the process of that number, if the agent's (its leader may have moved
    # to another group, and left this one empty; a number since reused by pid's is not killed, unless the agent is
    # root and so shares pid's uid)
    local rc
    digits "$3" || refuse "$2"
    kill -9 -"$3" ||
        { field "/proc/$3" Uid; [ "$FV" = "$UID_" ] && kill -9 "$3"; }
    rc=$?
    untrace "$3"
    say K "$2" "" "$rc"
}
op_killall() {  # K nonce: every process of the agent's uid, with builtins only (the process table may be full);
    # passes until one finds none (one that ended as it was looked at may have forked first: it counts as found);
    # the host asks again while some are found in the last pass
    local killed=0 found=0 pass p
    if [ "$UID_" != 0 ]; then   # (a root agent shares pid's uid: only its commands' groups are killed, by k)
        set +f
        for pass in 1 2 3 4 5 6 7 8 9 10; do
            found=0
            for p in /proc/[0-9]*; do
                field "$p" Uid
                case $FS:$FV in
                    [ZX]:*) ;;   # (dead already: a zombie waits for its parent)
                    ?:"$UID_") kill -9 "${p#/proc/}" && killed=$((killed + 1)); found=$((found + 1)) ;;
                    :) found=$((found + 1)) ;;
                esac
            done
            [ "$found" = 0 ] && break
        done
        set -f
    fi
    events
    say K "$2" "" "$killed" "$PE" "$found"
}
