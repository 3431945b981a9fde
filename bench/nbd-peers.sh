#!/usr/bin/env bash
# nbd-peers.sh — run the same fio jobs (ioengine=nbd, over Unix sockets)
# against tandem, nbdkit (file plugin) and qemu-nbd, each serving its own
# freshly written 1 GiB file, and print a Markdown comparison table.
#
# This is a benchmark, not a test: it never fails on "slow" numbers.
# See bench/README.md for how to run it and what the columns mean.
#
# Environment:
#   SERVERS      servers to run, in order (default "tandem nbdkit qemu-nbd";
#                tandem is skipped with a warning if it cannot be built,
#                unless SERVERS names it explicitly)
#   TANDEM_BIN   tandem binary (default <repo>/target/release/tandem; built
#                with `cargo build --release -p tandem-cli` if missing)
#   TANDEM_BUILD =1 to always run the cargo build first
#   TANDEM_ARGS / NBDKIT_ARGS / QEMU_NBD_ARGS  extra server arguments
#   RUNTIME      measured seconds per job (default 15)
#   RAMP         fio ramp_time seconds per job (default 3)
#   JOBS         subset of jobs, space separated (default: all, see JOB_LIST)
#   WORKDIR      where the image files/sockets go (default: mktemp -d /tmp)
#   KEEP_WORKDIR =1 to keep images, fio JSON and server logs
#   IMAGE_MB     image size in MiB (default 1024)
#   RESULTS_DIR  where the .md goes (default <repo>/bench/results)
#   DROP_CACHES  1 (default) drops the page cache after the prefill, 0 keeps it
#   WAIT_IDLE    before each job wait up to this many seconds for the machine
#                to be idle (< IDLE_PCT % busy, default 25) (default 0: off)
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
REPORT_PY="$SCRIPT_DIR/fio_report.py"
ORIG_CMD="$0${*:+ $*}"
# The environment settings the caller actually gave, for the report.
USER_ENV=""
for v in SERVERS JOBS RUNTIME RAMP IMAGE_MB WORKDIR KEEP_WORKDIR RESULTS_DIR \
  DROP_CACHES WAIT_IDLE IDLE_PCT TANDEM_BIN TANDEM_BUILD TANDEM_ARGS NBDKIT_ARGS QEMU_NBD_ARGS; do
  [[ -z ${!v+x} ]] || USER_ENV+="$v=$(printf '%q' "${!v}") "
done

RUNTIME=${RUNTIME:-15}
RAMP=${RAMP:-3}
IMAGE_MB=${IMAGE_MB:-1024}
TANDEM_BIN=${TANDEM_BIN:-$REPO/target/release/tandem}
RESULTS_DIR=${RESULTS_DIR:-$REPO/bench/results}
KEEP_WORKDIR=${KEEP_WORKDIR:-0}
SERVERS_EXPLICIT=${SERVERS:+1}
SERVERS=${SERVERS:-tandem nbdkit qemu-nbd}

# name | fio arguments
JOB_LIST=(randwrite16x2 randread16x2 randwrite1 randwrite1fsync seqwrite1m4)
declare -A JOB_ARGS=(
  [randwrite16x2]="--rw=randwrite --bs=4k --iodepth=16 --numjobs=2"
  [randread16x2]="--rw=randread --bs=4k --iodepth=16 --numjobs=2"
  [randwrite1]="--rw=randwrite --bs=4k --iodepth=1 --numjobs=1"
  [randwrite1fsync]="--rw=randwrite --bs=4k --iodepth=1 --numjobs=1 --fsync=1"
  [seqwrite1m4]="--rw=write --bs=1m --iodepth=4 --numjobs=1"
)
FIO_COMMON="--ioengine=nbd --group_reporting --time_based --runtime=$RUNTIME --ramp_time=$RAMP --randrepeat=0 --norandommap --output-format=json"

log() { printf '[nbd-peers] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- checks
[[ $RUNTIME =~ ^[0-9]+$ && $RUNTIME -ge 2 ]] || die "RUNTIME must be an integer >= 2 (got '$RUNTIME')"
[[ $RAMP =~ ^[0-9]+$ ]] || die "RAMP must be an integer >= 0 (got '$RAMP')"
[[ $IMAGE_MB =~ ^[0-9]+$ && $IMAGE_MB -ge 16 ]] || die "IMAGE_MB must be an integer >= 16"
[[ ${WAIT_IDLE:-0} =~ ^[0-9]+$ ]] || die "WAIT_IDLE must be an integer (seconds)"
[[ ${IDLE_PCT:-25} =~ ^[0-9]+$ ]] || die "IDLE_PCT must be an integer (percent of one core)"
for t in fio python3 nbdinfo dd; do
  command -v "$t" >/dev/null || die "$t not found (apt-get install -y fio nbdkit qemu-utils libnbd-bin)"
done
fio --enghelp=nbd >/dev/null 2>&1 || die "this fio has no nbd ioengine"

if [[ -n ${JOBS:-} ]]; then
  SELECTED=()
  for j in $JOBS; do
    [[ -n ${JOB_ARGS[$j]:-} ]] || die "unknown job '$j' (known: ${JOB_LIST[*]})"
    SELECTED+=("$j")
  done
  # keep the canonical order
  ORDERED=()
  for j in "${JOB_LIST[@]}"; do
    for s in "${SELECTED[@]}"; do [[ $s == "$j" ]] && { ORDERED+=("$j"); break; }; done
  done
  JOB_LIST=("${ORDERED[@]}")
fi

RUN_SERVERS=()
TANDEM_SKIPPED=""
for s in $SERVERS; do
  case $s in
    tandem)
      if [[ ${TANDEM_BUILD:-0} == 1 || ! -x $TANDEM_BIN ]]; then
        if [[ $TANDEM_BIN == "$REPO/target/release/tandem" ]] && command -v cargo >/dev/null; then
          log "building tandem: cargo build --release -p tandem-cli"
          (cd "$REPO" && cargo build --release -p tandem-cli >&2) || log "cargo build failed"
        fi
      fi
      if [[ -x $TANDEM_BIN ]]; then
        RUN_SERVERS+=(tandem)
      elif [[ -n $SERVERS_EXPLICIT ]]; then
        die "tandem binary '$TANDEM_BIN' not found/not executable (SERVERS names tandem explicitly)"
      else
        TANDEM_SKIPPED="binary '$TANDEM_BIN' is absent and could not be built"
        log "WARNING: tandem binary '$TANDEM_BIN' is absent and could not be built;"
        log "WARNING: benchmarking only the peers. Set SERVERS=\"nbdkit qemu-nbd\" to silence this."
      fi
      ;;
    nbdkit)   command -v nbdkit >/dev/null || die "nbdkit not found"; RUN_SERVERS+=(nbdkit) ;;
    qemu-nbd) command -v qemu-nbd >/dev/null || die "qemu-nbd not found"; RUN_SERVERS+=(qemu-nbd) ;;
    *) die "unknown server '$s' (known: tandem nbdkit qemu-nbd)" ;;
  esac
done
((${#RUN_SERVERS[@]} > 0)) || die "no servers to benchmark"

# ---------------------------------------------------------------- workdir
if [[ -n ${WORKDIR:-} ]]; then
  mkdir -p "$WORKDIR"
  WORKDIR=$(cd "$WORKDIR" && pwd)
  OWN_WORKDIR=0
else
  WORKDIR=$(mktemp -d /tmp/nbd-peers.XXXXXX)
  OWN_WORKDIR=1
fi
need_kb=$(( (${#RUN_SERVERS[@]} * IMAGE_MB + 256) * 1024 ))
avail_kb=$(df -Pk "$WORKDIR" | awk 'NR==2 {print $4}')
(( avail_kb >= need_kb )) || die "WORKDIR $WORKDIR has $((avail_kb/1024)) MiB free, need $((need_kb/1024)) MiB"

declare -A PID SOCK IMG SRV_CMD
CLK_TCK=$(getconf CLK_TCK)

STOP_RC=""
stop_server() { # name; sets STOP_RC to the server's exit status
  local s=$1 pid=${PID[$1]:-} i
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
  local rc=0
  wait "$pid" 2>/dev/null || rc=$?
  unset "PID[$s]"
  STOP_RC=$rc
}

SAMPLER=""
cleanup() {
  local s
  [[ -z $SAMPLER ]] || kill -TERM "$SAMPLER" 2>/dev/null || true
  for s in "${!PID[@]}"; do stop_server "$s"; done
  if [[ $KEEP_WORKDIR == 1 ]]; then
    log "kept workdir $WORKDIR"
  elif [[ $OWN_WORKDIR == 1 ]]; then
    rm -rf -- "$WORKDIR"
  else
    for s in "${!IMG[@]}"; do rm -f -- "${IMG[$s]}"; done
    for s in "${!SOCK[@]}"; do rm -f -- "${SOCK[$s]}"; done
    rm -rf -- "$WORKDIR/fio" "$WORKDIR/logs"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$WORKDIR/fio" "$WORKDIR/logs"

now() { echo "${EPOCHREALTIME/,/.}"; }

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
    (( (b - a) * 100 / CLK_TCK < ${IDLE_PCT:-25} )) && return 0
    waited=$((waited + 1))
  done
  BUSY_JOBS=$((BUSY_JOBS + 1))
  log "WARNING: machine still busy after waiting ${limit} s; running anyway"
}

wait_ready() { # name
  local s=$1 uri="nbd+unix:///?socket=${SOCK[$1]}" i size
  for ((i = 0; i < 300; i++)); do
    kill -0 "${PID[$s]}" 2>/dev/null || { cat "$WORKDIR/logs/$s.log" >&2; die "$s exited during startup"; }
    if [[ -S ${SOCK[$s]} ]] && size=$(nbdinfo --size "$uri" 2>/dev/null); then
      [[ $size == $((IMAGE_MB * 1048576)) ]] || die "$s exports $size bytes, expected $((IMAGE_MB * 1048576))"
      return 0
    fi
    sleep 0.1
  done
  cat "$WORKDIR/logs/$s.log" >&2
  die "$s did not become ready within 30 s"
}

start_server() { # name
  local s=$1 sock=$WORKDIR/$1.sock img=$WORKDIR/$1.img
  SOCK[$s]=$sock
  IMG[$s]=$img
  rm -f -- "$sock"
  local -a cmd
  # shellcheck disable=SC2206  # *_ARGS are deliberately word-split
  case $s in
    tandem)   cmd=("$TANDEM_BIN" serve --socket "$sock" ${TANDEM_ARGS:-} "$img") ;;
    nbdkit)   cmd=(nbdkit -U "$sock" -f ${NBDKIT_ARGS:-} file "$img") ;;
    qemu-nbd) cmd=(qemu-nbd -k "$sock" -f raw --cache=writeback --aio=threads -x '' -e 16 -t ${QEMU_NBD_ARGS:-} "$img") ;;
  esac
  SRV_CMD[$s]=$(printf '%q ' "${cmd[@]}")
  SRV_CMD[$s]=${SRV_CMD[$s]% }
  "${cmd[@]}" </dev/null >"$WORKDIR/logs/$s.log" 2>&1 &
  PID[$s]=$!
  wait_ready "$s"
  log "$s ready (pid ${PID[$s]}): ${SRV_CMD[$s]}"
}

# ---------------------------------------------------------------- prepare
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
b0=$(host_busy_ticks); sleep 1; b1=$(host_busy_ticks)
BUSY_START=$(( (b1 - b0) * 100 / CLK_TCK ))
if ((BUSY_START > ${IDLE_PCT:-25})); then
  log "WARNING: the machine is ${BUSY_START} % busy (100 % = one core) before the run: other work will distort the numbers (see WAIT_IDLE)"
fi
log "workdir $WORKDIR; servers: ${RUN_SERVERS[*]}; jobs: ${JOB_LIST[*]}; runtime ${RUNTIME}s + ramp ${RAMP}s"
for s in "${RUN_SERVERS[@]}"; do
  log "writing ${IMAGE_MB} MiB of random data to $WORKDIR/$s.img"
  dd if=/dev/urandom of="$WORKDIR/$s.img" bs=1M count="$IMAGE_MB" conv=fsync status=none
done
sync
# After a sequential prefill the kernel caches the images in large folios, and
# on Linux >= 6.16 a 4 KiB buffered write into a large folio costs ~15 us of
# kernel CPU (ext4 walks every block of the folio), for every server alike.
# Dropping the cache starts all servers from the state of a store that has
# been serving random I/O (small folios). DROP_CACHES=0 keeps the warm,
# large-folio cache; the report says which was used.
CACHE_STATE="warm (large folios from the prefill)"
if [[ ${DROP_CACHES:-1} == 1 ]]; then
  if echo 1 2>/dev/null >/proc/sys/vm/drop_caches; then
    CACHE_STATE="dropped after the prefill (echo 1 > /proc/sys/vm/drop_caches)"
  else
    log "WARNING: cannot drop the page cache (not root?); images stay cached in large folios"
  fi
fi
log "page cache: $CACHE_STATE"
for s in "${RUN_SERVERS[@]}"; do start_server "$s"; done

# ---------------------------------------------------------------- run
RECORDS=$WORKDIR/records.tsv
: >"$RECORDS"
declare -A DEAD
FIO_EXAMPLE="fio --name=JOB $FIO_COMMON <job args> --uri=nbd+unix:///?socket=SOCK --output=FILE"
# Server CPU: a sampler (fio_report.py sample) records the server's
# utime+stime every 0.2 s while fio runs. fio's start-up time (fork + NBD
# handshake) varies with load, but its measured period always ends just
# before it exits, so the report takes the CPU used over
# [fio exit - RUNTIME + 0.25 s, fio exit - 0.25 s] (interpolated between
# samples) and divides it by IOPS x window length.

for job in "${JOB_LIST[@]}"; do
  for s in "${RUN_SERVERS[@]}"; do
    out=$WORKDIR/fio/$job.$s.json
    smp=$WORKDIR/fio/$job.$s.cpu
    if [[ -n ${DEAD[$s]:-} ]]; then
      printf '%s\t%s\t%s\t%s\t-\t-\t%s\t%s\n' "$job" "$s" 99 "$out" "$RUNTIME" "$CLK_TCK" >>"$RECORDS"
      continue
    fi
    # Flush dirty page cache left by the previous run so its writeback does
    # not land in this one.
    sync
    sleep 1
    wait_idle
    uri="nbd+unix:///?socket=${SOCK[$s]}"
    # shellcheck disable=SC2206
    fio_cmd=(fio --name="$job" $FIO_COMMON ${JOB_ARGS[$job]} --uri="$uri" --output="$out")
    log "$job on $s ..."
    python3 "$REPORT_PY" sample "${PID[$s]}" "$smp" --interval 0.2 &
    SAMPLER=$!
    sleep 0.3
    rc=0
    "${fio_cmd[@]}" >"$WORKDIR/logs/fio.$job.$s.out" 2>&1 || rc=$?
    t_end=$(now)
    sleep 0.3
    kill -TERM "$SAMPLER" 2>/dev/null || true
    wait "$SAMPLER" || true
    SAMPLER=""
    if ! kill -0 "${PID[$s]}" 2>/dev/null; then
      DEAD[$s]=1
      log "ERROR: $s died during $job; see below. Skipping its remaining jobs."
      tail -n 20 "$WORKDIR/logs/$s.log" >&2 || true
      log "(fio exit status was $rc)"; rc=98
    fi
    if ((rc != 0)); then
      log "fio failed on $s (exit $rc):"
      tail -n 5 "$WORKDIR/logs/fio.$job.$s.out" >&2 || true
    else
      log "  $(python3 "$REPORT_PY" summary "$out" 2>&1)"
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$job" "$s" "$rc" "$out" "$smp" "$t_end" "$RUNTIME" "$CLK_TCK" >>"$RECORDS"
  done
done

# Stop the servers now (not in the trap) to record how they exit on SIGTERM.
declare -A EXIT_RC
for s in "${RUN_SERVERS[@]}"; do
  if [[ -n ${PID[$s]:-} ]]; then
    stop_server "$s"
    EXIT_RC[$s]=$STOP_RC
  fi
done

# ---------------------------------------------------------------- report
first_line() { "$@" 2>&1 | head -n 1 || true; }
stamp=$(date +%Y%m%d-%H%M%S)
mkdir -p "$RESULTS_DIR"
md=$RESULTS_DIR/nbd-peers-$stamp.md

tandem_ver="n/a"
if [[ " ${RUN_SERVERS[*]} " == *" tandem "* ]]; then
  tandem_ver="$(first_line "$TANDEM_BIN" --version)"
fi
git_rev=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo "no commit")
git_dirty=$(git -C "$REPO" status --porcelain -- crates Cargo.toml Cargo.lock 2>/dev/null | head -n 1)
[[ -z $git_dirty ]] || git_rev+=" (uncommitted changes in crates/)"

{
  echo "# NBD peers benchmark — $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo
  echo "Command (cwd \`$PWD\`): \`$USER_ENV$ORIG_CMD\`"
  if [[ -n $TANDEM_SKIPPED ]]; then
    echo
    echo "**tandem was not benchmarked: $TANDEM_SKIPPED**"
  fi
  echo
  echo "| | |"
  echo "|---|---|"
  echo "| fio | $(fio --version) |"
  echo "| tandem | $tandem_ver, repo $git_rev |"
  echo "| nbdkit | $(first_line nbdkit --version) |"
  echo "| qemu-nbd | $(first_line qemu-nbd --version) |"
  echo "| kernel | $(uname -srm) |"
  echo "| CPU | $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1), nproc $(nproc) |"
  echo "| memory | $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo) |"
  echo "| workdir fs | $(findmnt -no FSTYPE -T "$WORKDIR" 2>/dev/null || echo '?') ($WORKDIR) |"
  echo "| machine load | ${BUSY_START} % busy (100 % = one core) and load average $LOAD_START at start; load average $(cut -d' ' -f1-3 /proc/loadavg) at end |"
  if [[ ${WAIT_IDLE:-0} -gt 0 ]]; then
    echo "| idle wait | up to ${WAIT_IDLE} s before each job for < ${IDLE_PCT:-25} % busy; $BUSY_JOBS job(s) started on a busy machine |"
  fi
  echo "| runtime | ${RUNTIME} s measured + ${RAMP} s ramp per job; ${IMAGE_MB} MiB image per server, prefilled from /dev/urandom |"
  echo "| page cache at start | ${CACHE_STATE} |"
  echo
  echo "Servers (each on its own Unix socket and image file; all kept running, jobs interleaved):"
  echo
  for s in "${RUN_SERVERS[@]}"; do
    echo "- \`${SRV_CMD[$s]//$WORKDIR/\$WORKDIR}\` — exit status on SIGTERM: ${EXIT_RC[$s]:-?}"
  done
  echo
  echo "fio: \`$FIO_EXAMPLE\`, job args:"
  echo
  for j in "${JOB_LIST[@]}"; do echo "- $j: \`${JOB_ARGS[$j]}\`"; done
  echo
  python3 "$REPORT_PY" report "$RECORDS"
  echo "Latencies are fio completion latency (clat). Server CPU is utime+stime of the server"
  echo "process (all threads) sampled over the measured period, per completed read/write;"
  echo "server CPU % is of one core. Host busy % is the whole machine's non-idle CPU over the"
  echo "same window, out of $(nproc)00 % (server + fio + anything else running)."
} | tee "$md"

log "results written to ${md}"
