#!/usr/bin/env bash
# GPU work longer than one device call (10 minutes): start it in a session of its own, which outlives
# the call, then wait on it in later calls on the same machine (up to the 30 minutes a machine is held);
# each wait brings back what the work has written so far, as one tar under $OUT.
#
#   tools/bg.sh start NAME 'command'   # in the background, in a copy of this folder (a later call
#                                      # may refresh the working tree while it runs): /tmp/bg/NAME/tree;
#                                      # its output in /tmp/bg/NAME/log, its exit status in
#                                      # /tmp/bg/NAME/rc; it writes results under $BG_OUT
#                                      # (/tmp/bg/NAME/out)
#   tools/bg.sh wait NAME SECONDS      # until it ends or SECONDS pass; prints the log's tail; packs
#                                      # /tmp/bg/NAME but its tree (gzipped traces, but those of fixtures
#                                      # under a folder fx/, and files over 8 MiB left out) into
#                                      # $OUT/NAME.tgz; exits 0 when it ended, 3 while it runs
#
# Example, in one device call and then in as many as it needs:
#   tools/bg.sh start gpu 'bash tools/gpu_session.sh tests memory' && tools/bg.sh wait gpu 560
#   tools/bg.sh wait gpu 580
set -u
ROOT=${BG_ROOT:-/tmp/bg}  # BG_ROOT: somewhere else (the tests)

usage() {
    sed -n '2,17p' "$0" >&2
    exit 2
}

[ $# -ge 2 ] || usage
verb=$1
name=$2
dir="$ROOT/$name"

case "$verb" in
start)
    [ $# -eq 3 ] || usage
    if [ -f "$dir/pid" ] && [ ! -f "$dir/rc" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
        echo "bg: $name is already running (pid $(cat "$dir/pid"))" >&2
        exit 1
    fi
    command -v setsid >/dev/null || {
        echo "bg: setsid is not here: the work would end with this call" >&2
        exit 1
    }
    rm -rf "$dir"
    mkdir -p "$dir/out"
    # it runs in a copy of this folder: a later call may copy the working tree here anew while it runs
    tar cf - --exclude=./.git --exclude=./.venv . | (mkdir -p "$dir/tree" && cd "$dir/tree" && tar xf -) || exit 1
    printf '%s\n' "$3" >"$dir/command"
    date -u +%s >"$dir/started"
    # setsid: a session of its own, so that the end of this call does not end it
    # shellcheck disable=SC2016  # the inner shell expands its own arguments
    (cd "$dir/tree" && BG_OUT="$dir/out" PYTHONUNBUFFERED=1 setsid bash -c 'bash "$1" >"$2" 2>&1; echo $? >"$3"' _ \
        "$dir/command" "$dir/log" "$dir/rc" </dev/null >/dev/null 2>&1 &
        echo $! >"$dir/pid")
    echo "bg: $name started (pid $(cat "$dir/pid")) in $dir/tree: $3"
    ;;
wait)
    [ $# -eq 3 ] || usage
    [ -d "$dir" ] || {
        echo "bg: no $name here (this machine is a fresh one?)" >&2
        exit 1
    }
    deadline=$(($(date -u +%s) + $3))
    while [ ! -f "$dir/rc" ] && [ "$(date -u +%s)" -lt "$deadline" ]; do
        sleep 5
    done
    elapsed=$(($(date -u +%s) - $(cat "$dir/started")))
    tail -n 40 "$dir/log" 2>/dev/null
    if [ -n "${OUT:-}" ]; then
        # traces left out but those of recorded fixtures (a folder named fx): small, and the reason for the run
        # (any *.json.gz elsewhere too: a fix run's rounds and rank traces took a session's tar past the 16 MiB
        # a file may have to come back)
        (cd "$dir" && find . -path ./tree -prune -o -type f -size -8M \( -path '*/fx/*' -o \( ! -name '*.json.gz' \
            ! -name '*.pt.trace.json*' ! -name '*.pickle' \) \) -print0 | tar czf "$OUT/$name.tgz" --null -T -)
    fi
    if [ -f "$dir/rc" ]; then
        echo "bg: $name ended with exit status $(cat "$dir/rc") after ${elapsed} s"
        exit 0
    fi
    echo "bg: $name still running after ${elapsed} s"
    exit 3
    ;;
*)
    usage
    ;;
esac
