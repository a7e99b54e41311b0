# channel.sh's functions for a /bin/sh without bash (dash, busybox ash), sourced by it in place of what bash does with
# builtins: replies and reads go through `head`, `wc` and `read` by lines, and every command is a new shell.
say() {  # $1 tag, $2 nonce, $3 payload (no NUL), then the fields
    local tag="$1" nonce="$2" data="$3"
    shift 3
    printf '%s %s%s %d\n%s' "$tag" "$nonce" "${*:+ $*}" "${#data}" "$data"
}
say_head() { say_copy "$@"; }   # the file's first <max> bytes, through head
slurp() { S=; read -r S <"$1"; }   # POSIX sh reads byte by byte: nothing is read ahead (bash: channel.sh)
field() {  # FV <- the first number of field $2 ("Uid") in process directory $1's status, FS <- its state's letter
    # (State comes first); both empty when it is gone
    local k v rest
    FV= FS=
    while read -r k v rest; do
        case $k in State:) FS=$v ;; "$2:") FV=$v; return 0 ;; esac
    done <"$1/status"
}
nap() { sleep 0.01; }
hello_more() { :; }
readcmd() {  # CMD <- $1 bytes of stdin; fewer (the host gave up half-way): nothing of it may run, the server ends
    headkind
    CMD=$(take "$1"; echo .); CMD=${CMD%.}; [ "${#CMD}" -eq "$1" ] || quit   # (the dot keeps trailing newlines)
}
request() {  # (by lines; one of another length is out of step: refused, as op "-")
    IFS= read -r LINE || return 1; [ "${#LINE}" -eq $((REQUEST_HEADER - 1)) ] || LINE=-
}
host_gone() { false; }; idle() { :; }   # POSIX sh cannot tell, nor start a shell ahead (bash: channel.sh)
reap() { wait "$1"; RC=$?; }   # RC <- a command shell's status (bash: from whichever process started it)
disown() { :; }   # (bash's job table, which channel.sh empties, is not here: no program of that name is looked for)
ours() { :; }   # (every command's shell is this server's own child: its number is taken until reaped)
quit() { rm -f "$MARK"; exit 0; }
