# bench/lib.sh — shared by the benchmark scripts in bench/ (sourced, not run).
#
# The caller sets BENCH_TAG (log prefix), SCRIPT_DIR and REPO, runs under
# `set -euo pipefail`, and then typically:
#
#   bench_user_env VAR...        # remember the knobs the caller set (report)
#   bench_common_env             # defaults + checks of the shared knobs, JOBS
#   bench_need CMD PKG ...       # tools, installed with apt-get if missing
#   bench_workdir PREFIX NEED_MB # WORKDIR (mktemp unless given), free space
#   bench_traps                  # trap cleanup EXIT (cleanup calls bench_stop_all)
#   bench_spawn LABEL LOG CMD... # start a server process, PIDOF[LABEL]
#   bench_machine_start; bench_drop_caches
#   bench_run_job JOB SERVER URI PIDS [LABELS]   # one fio run + CPU sampler
#   bench_stop LABEL / bench_stop_all
#   bench_env_rows               # machine rows of the report's header table
#
# Processes are only ever signalled by the PIDs this script started.

# shellcheck shell=bash
# shellcheck disable=SC2034  # variables are used by the scripts sourcing this

REPORT_PY="$SCRIPT_DIR/fio_report.py"
CLK_TCK=$(getconf CLK_TCK)

log() { printf '[%s] %s\n' "$BENCH_TAG" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { echo "${EPOCHREALTIME/,/.}"; }

# name | fio arguments
JOB_LIST=(randwrite16x2 randread16x2 randwrite1 randwrite1fsync seqwrite1m4)
declare -A JOB_ARGS=(
  [randwrite16x2]="--rw=randwrite --bs=4k --iodepth=16 --numjobs=2"
  [randread16x2]="--rw=randread --bs=4k --iodepth=16 --numjobs=2"
  [randwrite1]="--rw=randwrite --bs=4k --iodepth=1 --numjobs=1"
  [randwrite1fsync]="--rw=randwrite --bs=4k --iodepth=1 --numjobs=1 --fsync=1"
  [seqwrite1m4]="--rw=write --bs=1m --iodepth=4 --numjobs=1"
)

# bench_user_env VAR... — USER_ENV: the given variables the caller actually
# set, as shell words, for the report's command line.
bench_user_env() {
  local v
  USER_ENV=""
  for v; do
    [[ -z ${!v+x} ]] || USER_ENV+="$v=$(printf '%q' "${!v}") "
  done
}

# Defaults and checks of the knobs every script shares; FIO_COMMON; JOBS
# selects a subset of JOB_LIST (kept in canonical order).
bench_common_env() {
  RUNTIME=${RUNTIME:-15}
  RAMP=${RAMP:-3}
  IMAGE_MB=${IMAGE_MB:-1024}
  TANDEM_BIN=${TANDEM_BIN:-$REPO/target/release/tandem}
  RESULTS_DIR=${RESULTS_DIR:-$REPO/bench/results}
  KEEP_WORKDIR=${KEEP_WORKDIR:-0}
  WAIT_IDLE=${WAIT_IDLE:-0}
  IDLE_PCT=${IDLE_PCT:-25}
  DROP_CACHES=${DROP_CACHES:-1}
  [[ $RUNTIME =~ ^[0-9]+$ && $RUNTIME -ge 2 ]] || die "RUNTIME must be an integer >= 2 (got '$RUNTIME')"
  [[ $RAMP =~ ^[0-9]+$ ]] || die "RAMP must be an integer >= 0 (got '$RAMP')"
  [[ $IMAGE_MB =~ ^[0-9]+$ && $IMAGE_MB -ge 16 ]] || die "IMAGE_MB must be an integer >= 16"
  [[ $WAIT_IDLE =~ ^[0-9]+$ ]] || die "WAIT_IDLE must be an integer (seconds)"
  [[ $IDLE_PCT =~ ^[0-9]+$ ]] || die "IDLE_PCT must be an integer (percent of one core)"
  FIO_COMMON="--ioengine=nbd --group_reporting --time_based --runtime=$RUNTIME --ramp_time=$RAMP --randrepeat=0 --norandommap --output-format=json"

  if [[ -n ${JOBS:-} ]]; then
    local j s
    local -a selected=() ordered=()
    for j in $JOBS; do
      [[ -n ${JOB_ARGS[$j]:-} ]] || die "unknown job '$j' (known: ${JOB_LIST[*]})"
      selected+=("$j")
    done
    for j in "${JOB_LIST[@]}"; do
      for s in "${selected[@]}"; do [[ $s == "$j" ]] && { ordered+=("$j"); break; }; done
    done
    JOB_LIST=("${ordered[@]}")
  fi
}

# bench_need CMD PACKAGE [CMD PACKAGE ...] — make sure the commands exist;
# missing ones are installed with apt-get when running as root on a Debian-like
# system (BENCH_INSTALL=0 turns that off), otherwise the script stops with
# the apt-get command to run.
bench_need() {
  local -a missing=() pkgs=()
  while (($# >= 2)); do
    command -v "$1" >/dev/null || { missing+=("$1"); pkgs+=("$2"); }
    shift 2
  done
  ((${#missing[@]} > 0)) || return 0
  # shellcheck disable=SC2207  # package names have no spaces
  pkgs=($(printf '%s\n' "${pkgs[@]}" | sort -u))
  if [[ ${BENCH_INSTALL:-1} == 1 && $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    log "missing ${missing[*]}: apt-get install -y ${pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${pkgs[@]}" >&2 ||
      { DEBIAN_FRONTEND=noninteractive apt-get update >&2 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y "${pkgs[@]}" >&2; } ||
      log "apt-get failed"
  fi
  local m
  for m in "${missing[@]}"; do
    command -v "$m" >/dev/null || die "$m not found (apt-get install -y ${pkgs[*]})"
  done
}

# bench_tandem_bin — build the default tandem binary if missing (or always
# with TANDEM_BUILD=1); returns 0 if TANDEM_BIN is executable.
bench_tandem_bin() {
  if [[ ${TANDEM_BUILD:-0} == 1 || ! -x $TANDEM_BIN ]]; then
    if [[ $TANDEM_BIN == "$REPO/target/release/tandem" ]] && command -v cargo >/dev/null; then
      log "building tandem: cargo build --release -p tandem-cli"
      (cd "$REPO" && cargo build --release -p tandem-cli >&2) || log "cargo build failed"
    fi
  fi
  [[ -x $TANDEM_BIN ]]
}

# bench_workdir PREFIX NEED_MB — WORKDIR (the given one, or a fresh
# mktemp -d /tmp/PREFIX.XXXXXX: OWN_WORKDIR=1) with NEED_MB + 256 MiB free.
bench_workdir() {
  local prefix=$1 need_mb=$2
  if [[ -n ${WORKDIR:-} ]]; then
    mkdir -p "$WORKDIR"
    WORKDIR=$(cd "$WORKDIR" && pwd)
    OWN_WORKDIR=0
  else
    WORKDIR=$(mktemp -d "/tmp/$prefix.XXXXXX")
    OWN_WORKDIR=1
  fi
  local need_kb=$(((need_mb + 256) * 1024)) avail_kb
  avail_kb=$(df -Pk "$WORKDIR" | awk 'NR==2 {print $4}')
  ((avail_kb >= need_kb)) || die "WORKDIR $WORKDIR has $((avail_kb / 1024)) MiB free, need $((need_kb / 1024)) MiB"
  mkdir -p "$WORKDIR/fio" "$WORKDIR/logs"
}

# ---------------------------------------------------------------- processes
declare -A PIDOF=() # label -> PID of a process this script started
STARTED=()          # labels, in start order

# bench_spawn LABEL LOGFILE CMD... — start CMD in the background (stdin
# /dev/null, stdout+stderr to LOGFILE); its PID goes to PIDOF[LABEL].
bench_spawn() {
  local label=$1 logf=$2
  shift 2
  "$@" </dev/null >"$logf" 2>&1 &
  PIDOF[$label]=$!
  STARTED+=("$label")
}

# bench_stop LABEL — SIGTERM, SIGKILL after 10 s; STOP_RC = exit status.
STOP_RC=""
bench_stop() {
  local s=$1 pid=${PIDOF[$1]:-} i rc=0
  STOP_RC=""
  [[ -n $pid ]] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$s (pid $pid) ignored SIGTERM for 10 s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || rc=$?
  unset "PIDOF[$s]"
  STOP_RC=$rc
}

# Stop everything still running, last started first; stop the CPU sampler.
SAMPLER=""
bench_stop_all() {
  local i
  [[ -z $SAMPLER ]] || kill -TERM "$SAMPLER" 2>/dev/null || true
  SAMPLER=""
  for ((i = ${#STARTED[@]} - 1; i >= 0; i--)); do
    bench_stop "${STARTED[i]}"
  done
}

# bench_traps — the caller's cleanup on every exit; Ctrl-C and SIGTERM exit
# with 130 and 143 (and so run it too).
bench_traps() {
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

# bench_wait_nbd NAME SOCK SIZE — until the export at SOCK answers with SIZE bytes,
# while every process of NAME (the caller's PIDS[NAME]) still runs.
bench_wait_nbd() {
  local s=$1 sock=$2 want=$3 i size
  for ((i = 0; i < 300; i++)); do
    bench_alive "${PIDS[$s]}" || { tail -n 30 "$WORKDIR/logs/$s".*log >&2 || true; die "$s exited during startup"; }
    if [[ -S $sock ]] && size=$(nbdinfo --size "nbd+unix:///?socket=$sock" 2>/dev/null); then
      [[ $size == "$want" ]] || die "$s exports $size bytes, expected $want"
      return 0
    fi
    sleep 0.1
  done
  tail -n 30 "$WORKDIR/logs/$s".*log >&2 || true
  die "$s: no NBD export on $sock within 30 s"
}

# bench_remove_workdir — an exit's cleanup of the files: the workdir if we made it, else
# what we made in it (the caller's CREATED) and our fio and log folders. KEEP_WORKDIR=1
# keeps everything. Returns 1 when kept.
bench_remove_workdir() {
  local f
  if [[ $KEEP_WORKDIR == 1 ]]; then
    log "kept workdir $WORKDIR"
    return 1
  elif [[ $OWN_WORKDIR == 1 ]]; then
    rm -rf -- "$WORKDIR"
  else
    for f in "${CREATED[@]}"; do rm -rf -- "$f"; done
    rm -rf -- "$WORKDIR/fio" "$WORKDIR/logs"
  fi
}

# add_cmd KEY CMD... — record a server process's command line for the report:
# appended as one shell-quoted line to the caller's SRV_CMDS[KEY] (declare -A).
add_cmd() {
  local c
  c=$(printf '%q ' "${@:2}")
  c=${c//\\,/,} # %q escapes commas, which the shell does not need
  SRV_CMDS[$1]+="${c% }"$'\n'
}

# bench_alive PID,PID... — all of them still running?
bench_alive() {
  local p
  for p in ${1//,/ }; do kill -0 "$p" 2>/dev/null || return 1; done
}

# ---------------------------------------------------------------- machine
host_busy_ticks() { # non-idle CPU ticks of the whole machine
  awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}

# With WAIT_IDLE=N, wait up to N s until the machine is idle (< IDLE_PCT %
# busy over one second, 100 % = one core) before a job, so that other work
# on a shared machine does not land in a measurement.
BUSY_JOBS=0
wait_idle() {
  local limit=${WAIT_IDLE:-0} waited=0 a b
  ((limit > 0)) || return 0
  while ((waited < limit)); do
    a=$(host_busy_ticks); sleep 1; b=$(host_busy_ticks)
    (((b - a) * 100 / CLK_TCK < ${IDLE_PCT:-25})) && return 0
    waited=$((waited + 1))
  done
  BUSY_JOBS=$((BUSY_JOBS + 1))
  log "WARNING: machine still busy after waiting ${limit} s; running anyway"
}

# LOAD_START, BUSY_START: how busy the machine is before the run.
bench_machine_start() {
  local b0 b1
  LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
  b0=$(host_busy_ticks); sleep 1; b1=$(host_busy_ticks)
  BUSY_START=$(((b1 - b0) * 100 / CLK_TCK))
  if ((BUSY_START > ${IDLE_PCT:-25})); then
    log "WARNING: the machine is ${BUSY_START} % busy (100 % = one core) before the run: other work will distort the numbers (see WAIT_IDLE)"
  fi
}

# After a sequential prefill the kernel caches the images in large folios, and
# on Linux >= 6.16 a 4 KiB buffered write into a large folio costs ~15 us of
# kernel CPU (ext4 walks every block of the folio), for every server alike.
# Dropping the cache starts all servers from the state of a store that has
# been serving random I/O (small folios). DROP_CACHES=0 keeps the warm,
# large-folio cache; the report says which was used. Sets CACHE_STATE.
bench_drop_caches() {
  sync
  CACHE_STATE="warm (large folios from the prefill)"
  if [[ ${DROP_CACHES:-1} == 1 ]]; then
    if echo 1 2>/dev/null >/proc/sys/vm/drop_caches; then
      CACHE_STATE="dropped after the prefill (echo 1 > /proc/sys/vm/drop_caches)"
    else
      log "WARNING: cannot drop the page cache (not root?); images stay cached in large folios"
    fi
  fi
  log "page cache: $CACHE_STATE"
}

# ---------------------------------------------------------------- fio runs
# Server CPU: a sampler (fio_report.py sample) records the server's
# utime+stime every 0.2 s while fio runs. fio's start-up time (fork + NBD
# handshake) varies with load, but its measured period always ends just
# before it exits, so the report takes the CPU used over
# [fio exit - RUNTIME + 0.25 s, fio exit - 0.25 s] (interpolated between
# samples) and divides it by IOPS x window length.
declare -A DEAD=()
FIO_EXAMPLE_URI="nbd+unix:///?socket=SOCK"

# bench_run_job JOB SERVER URI PIDS [LABELS] — run fio job JOB against the
# NBD server SERVER at URI and append a record line to $RECORDS. PIDS:
# comma-separated PIDs whose CPU (with their descendants) is the server's;
# LABELS names them (comma-separated) for the per-process CPU split. If one
# of PIDS dies, DEAD[SERVER] is set and the server's later jobs are skipped.
bench_run_job() {
  local job=$1 s=$2 uri=$3 pids=$4 labels=${5:-}
  local out=$WORKDIR/fio/$job.$s.json smp=$WORKDIR/fio/$job.$s.cpu rc=0 t_end f
  if [[ -n ${DEAD[$s]:-} ]]; then
    printf '%s\t%s\t%s\t%s\t-\t-\t%s\t%s\n' "$job" "$s" 99 "$out" "$RUNTIME" "$CLK_TCK" >>"$RECORDS"
    return 0
  fi
  # Flush dirty page cache left by the previous run so its writeback does
  # not land in this one.
  sync
  sleep 1
  wait_idle
  local -a fio_cmd
  # shellcheck disable=SC2206  # FIO_COMMON and JOB_ARGS are word lists
  fio_cmd=(fio --name="$job" $FIO_COMMON ${JOB_ARGS[$job]} --uri="$uri" --output="$out")
  log "$job on $s ..."
  python3 "$REPORT_PY" sample "$pids" "$smp" --interval 0.2 ${labels:+--labels "$labels"} &
  SAMPLER=$!
  sleep 0.3
  "${fio_cmd[@]}" >"$WORKDIR/logs/fio.$job.$s.out" 2>&1 || rc=$?
  t_end=$(now)
  sleep 0.3
  kill -TERM "$SAMPLER" 2>/dev/null || true
  wait "$SAMPLER" || true
  SAMPLER=""
  if ! bench_alive "$pids"; then
    DEAD[$s]=1
    log "ERROR: $s died during $job; see below. Skipping its remaining jobs."
    for f in "$WORKDIR/logs/$s.log" "$WORKDIR/logs/$s".*.log; do
      [[ -e $f ]] || continue
      log "--- $f"
      tail -n 20 "$f" >&2 || true
    done
    log "(fio exit status was $rc)"
    rc=98
  fi
  if ((rc != 0)); then
    log "fio failed on $s (exit $rc):"
    tail -n 5 "$WORKDIR/logs/fio.$job.$s.out" >&2 || true
  else
    log "  $(python3 "$REPORT_PY" summary "$out" 2>&1)"
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$job" "$s" "$rc" "$out" "$smp" "$t_end" "$RUNTIME" "$CLK_TCK" >>"$RECORDS"
}

# ---------------------------------------------------------------- report
first_line() { "$@" 2>&1 | head -n 1 || true; }

# GIT_REV: the repository's commit, and whether crates/ has local changes.
bench_git_rev() {
  local dirty
  GIT_REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo "no commit")
  dirty=$(git -C "$REPO" status --porcelain -- crates Cargo.toml Cargo.lock 2>/dev/null | head -n 1)
  [[ -z $dirty ]] || GIT_REV+=" (uncommitted changes in crates/)"
}

# Rows of the report's header table describing the machine and the run.
bench_env_rows() {
  echo "| kernel | $(uname -srm) |"
  echo "| CPU | $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1), nproc $(nproc) |"
  echo "| memory | $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo) |"
  echo "| workdir fs | $(findmnt -no FSTYPE -T "$WORKDIR" 2>/dev/null || echo '?') ($WORKDIR) |"
  echo "| machine load | ${BUSY_START} % busy (100 % = one core) and load average $LOAD_START at start; load average $(cut -d' ' -f1-3 /proc/loadavg) at end |"
  if [[ ${WAIT_IDLE:-0} -gt 0 ]]; then
    echo "| idle wait | up to ${WAIT_IDLE} s before each job for < ${IDLE_PCT:-25} % busy; $BUSY_JOBS job(s) started on a busy machine |"
  fi
}
