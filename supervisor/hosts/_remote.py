"""The shell scripts the SSH host runs on a remote box (``_remote_parse`` reads what they print).

Every operation is one POSIX ``sh`` script sent on a channel's stdin to ``/bin/sh -s`` (a
resident one for short operations, which runs each script in a subshell), so the user's
login shell only ever parses ``/bin/sh -s`` (fish, csh or a long command line cannot change
what runs) and all arguments are shell-quoted assignments that ``/bin/sh`` itself reads.
The script is wrapped in ``{ ... }``: the shell parses the whole group before running any
of it, so a command in the script that reads stdin can never swallow the rest of the script.

Every script prints ``@@supervise@@`` before its answer: whatever a chatty ``.bashrc``
prints first is skipped.

What the scripts rely on: ``/proc`` (Linux), GNU-compatible ``grep -z``, ``awk``,
``setsid`` (for the wrapper), a ``sleep`` that takes fractions; following logs and watching
exits is the agent's work (ssh/_agent_program.py, on the box's Python 3).  ``supervise
doctor --host`` checks each of them.

Process facts come from ``/proc/<pid>/stat`` read with the shell's own ``read`` (no process
per pid): the fields after the command name's last ``) `` are state, ppid, pgrp, session,
..., starttime (the 20th of them, in clock ticks since boot).  The start time is kept as
that raw tick count: it never changes for a process, whereas ``btime`` from ``/proc/stat``
may move by a second between reads, and comparing exactly is then safe.
"""

from __future__ import annotations

import shlex

MARK = b"@@supervise@@"


def script(body: str, *args: str) -> bytes:
    """A complete script for ``/bin/sh -s``: the marker, the arguments as ``$1..``, the body."""
    quoted = " ".join(shlex.quote(a) for a in args)
    # The closing `exit` matters for long-lived channels, whose stdin stays open: without
    # it the shell would wait there for more script once the body is done.
    return f"{{\nprintf '%s\\n' '{MARK.decode()}'\nset -- {quoted}\n{body}\nexit\n}}\n".encode()


def after_mark(out: bytes) -> bytes | None:
    """What a script printed after its marker line, or None when the marker never came."""
    at = out.find(MARK + b"\n")
    return None if at < 0 else out[at + len(MARK) + 1 :]


# -- shared shell functions ----------------------------------------------------------------

PROC_FUNCS = r"""
_stat() {  # PID: sets S_STATE S_PPID S_PGRP S_SID S_START; fails when there is no such process
  _s=
  { read -r _s <"/proc/$1/stat"; } 2>/dev/null
  [ -n "$_s" ] || return 1
  set -- ${_s##*") "}
  S_STATE=$1 S_PPID=$2 S_PGRP=$3 S_SID=$4
  shift 19
  S_START=$1
}
_alive() {  # PID START ('-': any start time): a live process, zombies count as gone
  _stat "$1" || return 1
  case $S_STATE in Z|X|x) return 1;; esac
  [ "$2" = - ] || [ "$S_START" = "$2" ]
}
_tagged() {  # TAG: pids whose environment holds SUPERVISE_ATTEMPT=TAG, space-separated
  [ -n "$1" ] || return 0
  grep -lsxzF -e "SUPERVISE_ATTEMPT=$1" /proc/[0-9]*/environ 2>/dev/null | sed -e 's,^/proc/,,' -e 's,/environ$,,' | tr '\n' ' '
}
_wrapper_alive() {  # WRAPPER_PID WRAPPER_START: the attempt's wrapper, positively identified
  # Never pid 0 or 1, and never without its start time: a pid alone may have been reused by
  # anything (init included), and its group and tree would then be somebody else's.
  [ "$1" -gt 1 ] && [ "$2" != - ] && _alive "$1" "$2"
}
_ancestors() {  # this script's own ancestry (its shell, sshd's session, ...), never a target
  _a=" $$ "
  _q=$$
  while [ "$_q" -gt 1 ] && _stat "$_q"; do _q=$S_PPID; _a="$_a$_q "; done
  printf '%s' "$_a"
}
_members() {  # WRAPPER_PID WRAPPER_START PGID TAG: every live process of the attempt, one pid a line
  _mw=0
  _wrapper_alive "$1" "$2" && _mw=1
  _mt=" $(_tagged "$4") "
  _ma=$(_ancestors)
  for _d in /proc/[0-9]*; do
    _p=${_d#/proc/}
    _stat "$_p" || continue
    case $S_STATE in Z|X|x) continue;; esac
    echo "$_p $S_PPID $S_PGRP"
  done | awk -v root="$1" -v alive="$_mw" -v pg="$3" -v tagged="$_mt" -v mine="$_ma" '
    { ppid[$1] = $2; grp[$1] = $3; order[NR] = $1 }
    END {
      if (alive) {
        mark[root] = 1
        do {
          more = 0
          for (i = 1; i <= NR; i++) {
            p = order[i]
            if (!(p in mark) && (ppid[p] in mark)) { mark[p] = 1; more = 1 }
          }
        } while (more)
      }
      for (i = 1; i <= NR; i++) {
        p = order[i]
        if (p <= 1 || index(mine, " " p " ")) continue
        if ((p in mark) || (alive && pg > 1 && grp[p] == pg) || index(tagged, " " p " ")) print p
      }
    }'
}
_name() {  # PID: its command line (or name), on one line
  _n=$(head -c 200 "/proc/$1/cmdline" 2>/dev/null | tr '\0\n' '  ')
  if [ -z "$_n" ]; then _n=$(cat "/proc/$1/comm" 2>/dev/null); fi
  printf '%s\n' "${_n:-?}"
}
_now() {  # NOW: centiseconds since boot, without starting a process
  read -r _up _rest </proc/uptime
  _f=${_up#*.}
  _f=${_f#0}
  NOW=$(( ${_up%.*} * 100 + _f ))
}
"""

# -- operations ---------------------------------------------------------------------------

INFO = r"""
printf 'home %s\n' "$HOME"
printf 'user %s\n' "$(id -un 2>/dev/null)"
"""

LOG_SUFFIX = r"""
base=$1; k=0; p="$base.log"
while [ -e "$p" ]; do k=$((k + 1)); p="$base.$k.log"; done
echo "$k"
"""

# $1 log, $2 status, $3 tag; the launch command line itself is spliced in as LAUNCH.
# The log's directory is made 0700 and the log 0600 whatever the login shell's umask: a job's log
# may hold a token it printed (HF_TOKEN), and the box may have other users.
# The log is created first with noclobber (O_EXCL): log_paths never hands out an existing
# log, so finding it already there means an earlier try of this very launch ran (its answer
# was lost with the connection).  Then the attempt is found by its tag instead of being
# started twice.
LAUNCH = PROC_FUNCS + r"""
trap '' PIPE HUP
log=$1 status=$2 tag=$3
( umask 077 && mkdir -p -- "${log%/*}" && chmod 700 -- "${log%/*}" ) 2>/dev/null
if ( umask 077 && set -C && : >"$log" ) 2>/dev/null; then
  rm -f -- "$status" "$status.tmp"
  pid=$(@LAUNCH@ </dev/null)
  rc=$?
  case $pid in
    ''|*[!0-9]*)
      echo "wrapper exit $rc, printed '$pid': $(tail -c 300 -- "$log" 2>/dev/null | tr '\n' ' ')" >&2
      exit 113;;
  esac
  # The wrapper prints its pid before its setsid has run: wait until it leads its own
  # process group, or signalling the group would miss it.
  i=0
  while _stat "$pid" && [ "$S_PGRP" != "$pid" ] && [ "$i" -lt 500 ]; do sleep 0.01; i=$((i + 1)); done
  if _stat "$pid"; then echo "launched $pid $S_START $S_PGRP"; else echo "launched $pid - $pid"; fi
  exit 0
fi
i=0
while [ "$i" -lt 500 ]; do
  best= best_start=
  for p in $(_tagged "$tag"); do
    _stat "$p" || continue
    [ "$S_PGRP" = "$p" ] && [ "$S_SID" = "$p" ] || continue
    if [ -z "$best" ] || [ "$S_START" -lt "$best_start" ]; then best=$p best_start=$S_START; fi
  done
  if [ -n "$best" ]; then echo "launched $best $best_start $best"; exit 0; fi
  if [ -e "$status" ]; then echo "ended $(cat -- "$status")"; exit 0; fi
  sleep 0.01
  i=$((i + 1))
done
echo "the log $log exists but no process carries the attempt's tag $tag" >&2
exit 114
"""

ALIVE = PROC_FUNCS + r"""
if _alive "$1" "$2"; then echo alive; else echo gone; fi
"""

EXIT_STATUS = r"""
if [ -e "$1" ]; then echo present; cat -- "$1"; else echo absent; fi
"""

# $1 the exit-status file.  As EXIT_STATUS, then "age N": how many seconds ago the wrapper wrote
# it, by the box's own clock (so a clock that differs from the supervisor's does not matter);
# no age line where `stat -c` is missing.
EXIT_STATUS_AGED = r"""
if [ -e "$1" ]; then
  echo present; cat -- "$1"; echo
  m=$(stat -c %Y -- "$1" 2>/dev/null) && echo "age $(( $(date +%s) - m ))"
else echo absent; fi
"""

# $1 the log.  "log SIZE MTIME NOW" (times in seconds, with a fraction where stat and date give
# one): the log's age is read on the box's own clock, so a box whose clock is off dates it right.
LOG_STAT = r"""
if [ -f "$1" ]; then
  s=$(stat -c %s -- "$1") || exit 0
  m=$(stat -c %.9Y -- "$1" 2>/dev/null) || m=$(stat -c %Y -- "$1")
  echo "log $s $m $(date +%s.%N)"
else echo absent; fi
"""

ATTEMPT_PIDS = PROC_FUNCS + r"""
_members "$1" "$2" "$3" "$4"
"""

# $1 pid $2 start $3 pgid $4 tag $5 grace (centiseconds).  Prints "N pid name" the first
# time a process of the attempt is seen, "R pid" for each re-parented one, "A pid" for each
# one alive when the grace period ends, "K pid" for each SIGKILL and "S pid" for survivors.
# It finishes even if the connection drops meanwhile (SIGPIPE and SIGHUP ignored).
KILL_TREE = PROC_FUNCS + r"""
trap '' PIPE HUP
wp=$1 ws=$2 pg=$3 tag=$4 grace=$5
known=" "
_learn() {
  for _p in $1; do
    case $known in *" $_p "*) ;; *) known="$known$_p "; printf 'N %s %s\n' "$_p" "$(_name "$_p")";; esac
  done
}
_signal() {  # SIG PIDS
  if [ "$1" = KILL ]; then
    if [ "$pg" -gt 1 ] && [ "$pg" = "$wp" ] && _wrapper_alive "$wp" "$ws"; then kill -KILL -- "-$pg" 2>/dev/null; fi
    [ -z "$2" ] || kill -KILL $2 2>/dev/null
    return 0
  fi
  # TERM spares the wrapper, so that it outlives the command and records its exit status,
  # and is followed by CONT: a stopped process cannot act on TERM until it runs again.
  _t=
  for _p in $2; do [ "$_p" = "$wp" ] || _t="$_t $_p"; done
  [ -z "$_t" ] || { kill -"$1" $_t 2>/dev/null; kill -CONT $_t 2>/dev/null; }
  return 0
}
_still() {  # PIDS: those still alive, plus any process of the attempt that appeared meanwhile
  _out=
  for _p in $1; do _alive "$_p" - && _out="$_out $_p"; done
  for _p in $(_members "$wp" "$ws" "$pg" "$tag"); do
    case "$_out " in *" $_p "*) ;; *) _out="$_out $_p";; esac
  done
  echo $_out
}
alive=$(_members "$wp" "$ws" "$pg" "$tag" | tr '\n' ' ')
_learn "$alive"
for _p in $alive; do  # re-parented: a parent outside the attempt (the wrapper's is, by design)
  [ "$_p" != "$wp" ] && _stat "$_p" || continue
  case " $alive " in *" $S_PPID "*) ;; *) echo "R $_p";; esac
done
_signal TERM "$alive"
_now
deadline=$((NOW + grace))
while [ -n "$alive" ]; do
  _now
  [ "$NOW" -lt "$deadline" ] || break
  sleep 0.05
  alive=$(_still "$alive")
  _learn "$alive"
done
for p in $alive; do echo "A $p"; done
for round in 1 2 3; do
  [ -n "$alive" ] || break
  _signal KILL "$alive"
  for p in $alive; do echo "K $p"; done
  i=0
  while [ "$i" -lt 40 ]; do
    left=
    for p in $alive; do _alive "$p" - && left="$left $p"; done
    [ -n "$left" ] || break
    sleep 0.05
    i=$((i + 1))
  done
  alive=$(_still "$left")
  _learn "$alive"
done
for p in $alive; do echo "S $p"; done
"""

GPU_QUERY = "index,uuid,name,memory.used,memory.total,utilization.gpu"
APPS_QUERY = "pid,gpu_uuid,used_memory"
# Health: 7 columns on drivers that know remapped rows and clocks-event reasons, else 5 (the old names).
HEALTH_QUERY = ("index,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,"
                "remapped_rows.pending,remapped_rows.failure,clocks_event_reasons.active")
HEALTH_QUERY_OLD = "index,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,clocks_throttle_reasons.active"
XID_UNREADABLE = "@@kernel-log-unreadable@@"

# $1: the nvidia-smi command; $2: the kernel log command (e.g. dmesg; empty: not read).  One call
# per sample (not a streaming `-l` channel): the device and process queries then describe the same
# instant, and an empty process list cannot be mistaken for a missing one.  Health and the kernel
# log's Xid lines are extras: a driver or a box that cannot give them still gives memory.
GPUS = r"""
smi=$1 klog=${2:-}
if ! command -v "$smi" >/dev/null 2>&1; then echo missing; exit 0; fi
echo gpus
"$smi" --query-gpu=@GPU_QUERY@ --format=csv,noheader,nounits 2>&1 || exit 3
echo apps
"$smi" --query-compute-apps=@APPS_QUERY@ --format=csv,noheader,nounits 2>&1 || exit 4
echo health
"$smi" --query-gpu=@HEALTH_QUERY@ --format=csv,noheader,nounits 2>/dev/null ||
  "$smi" --query-gpu=@HEALTH_QUERY_OLD@ --format=csv,noheader,nounits 2>/dev/null || true
if [ -n "$klog" ]; then
  echo xids
  { $klog 2>/dev/null || echo '@XID_UNREADABLE@'; } | grep -F -e 'NVRM: Xid' -e '@XID_UNREADABLE@' | tail -n 32
fi
exit 0
""".replace("@GPU_QUERY@", GPU_QUERY).replace("@APPS_QUERY@", APPS_QUERY).replace(
    "@HEALTH_QUERY_OLD@", HEALTH_QUERY_OLD).replace("@HEALTH_QUERY@", HEALTH_QUERY).replace(
    "@XID_UNREADABLE@", XID_UNREADABLE)

# $1: the wrapper's pid: its child, the program it runs (the oldest, if it has several).
PROGRAM_PID = r"""
pgrep -o -P "$1" 2>/dev/null || ps -o pid= --ppid "$1" 2>/dev/null | head -n 1
"""

# $1: the log root (already expanded); $2: the nvidia-smi command; $3 py-spy; $4 the kernel log
# command; $5 the Python that runs the SSH agent.  key=value lines.
DOCTOR = r"""
root=$1 smi=$2 spy=${3:-py-spy} klog=${4:-} py=${5:-python3}
echo "sh=$(readlink -f /bin/sh 2>/dev/null || echo /bin/sh)"
if command -v setsid >/dev/null 2>&1; then echo "setsid=$(command -v setsid)"; else echo "setsid="; fi
if [ -r /proc/self/stat ] && [ -r /proc/uptime ] && [ -r /proc/self/environ ]; then echo "proc=ok"; else echo "proc="; fi
if printf 'x\0SUPERVISE_ATTEMPT=t\0' | grep -qxzF -e SUPERVISE_ATTEMPT=t 2>/dev/null; then echo "grep=ok"; else echo "grep="; fi
if echo 1 | awk '{ exit $1 - 1 }' 2>/dev/null; then echo "awk=ok"; else echo "awk="; fi
if sleep 0.01 2>/dev/null; then echo "sleep=ok"; else echo "sleep="; fi
echo "python3=$("$py" --version 2>&1 | head -n 1)"
if command -v "$smi" >/dev/null 2>&1; then
  echo "nvidia_smi=$(command -v "$smi")"
  out=$("$smi" -L 2>&1); rc=$?
  echo "nvidia_smi_rc=$rc"
  echo "nvidia_smi_gpus=$(printf '%s\n' "$out" | grep -c '^GPU ')"
  echo "nvidia_smi_first=$(printf '%s\n' "$out" | head -n 1)"
else
  echo "nvidia_smi="
fi
echo "root=$root"
d=$root
while [ ! -d "$d" ] && [ "$d" != / ] && [ -n "$d" ]; do d=$(dirname -- "$d"); done
echo "root_existing=$d"
echo "root_writable=$( [ -w "$d" ] && echo yes || echo no )"
echo "df=$(df -Pk -- "$d" 2>/dev/null | awk 'NR == 2 { print $4 }')"
found=$(command -v "$spy" 2>/dev/null) || found=
if [ -z "$found" ] && [ -x "$HOME/.local/bin/py-spy" ]; then found=$HOME/.local/bin/py-spy; fi
echo "pyspy=$found"
if [ -n "$found" ]; then echo "pyspy_version=$("$found" --version 2>&1 | head -n 1)"; fi
if [ -n "$klog" ]; then
  if $klog >/dev/null 2>&1; then echo "kernel_log=ok"; else echo "kernel_log=refused"; fi
fi
"""


# $1 py-spy (a name on the box's PATH, or a path), $2 seconds each; then the pids.  ~/.local/bin's
# py-spy when $1 is not found; "nopyspy" when there is none.  Each pid dumped at once, in parallel,
# then printed as "=== PID RC NAME" and its output.
STACKS = r"""
t=$2; spy=$(command -v "$1" 2>/dev/null) || spy=; shift 2
[ -z "$spy" ] && [ -x "$HOME/.local/bin/py-spy" ] && spy=$HOME/.local/bin/py-spy
if [ -z "$spy" ]; then echo nopyspy; exit 0; fi
dir=$(mktemp -d 2>/dev/null) || { echo nopyspy; exit 0; }
for pid in "$@"; do
  # A stopped process (SIGSTOP, a frozen rank) cannot be paused again: read it as it stands.
  ( timeout "$t" "$spy" dump --pid "$pid" >"$dir/$pid.out" 2>&1; rc=$?
    if [ $rc -ne 0 ] && grep -q "Failed to suspend" "$dir/$pid.out"; then
      timeout "$t" "$spy" dump --nonblocking --pid "$pid" >"$dir/$pid.out" 2>&1; rc=$?; fi
    echo $rc >"$dir/$pid.rc" ) &
done
wait
for pid in "$@"; do
  name=$(tr '\0\n' '  ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-120)
  printf '=== %s %s %s\n' "$pid" "$(cat "$dir/$pid.rc" 2>/dev/null || echo 1)" "$name"
  cat "$dir/$pid.out" 2>/dev/null
done
rm -rf "$dir"
"""
