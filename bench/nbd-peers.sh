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
BENCH_TAG=nbd-peers
# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"
ORIG_CMD="$0${*:+ $*}"
# The environment settings the caller actually gave, for the report.
bench_user_env SERVERS JOBS RUNTIME RAMP IMAGE_MB WORKDIR KEEP_WORKDIR RESULTS_DIR \
  DROP_CACHES WAIT_IDLE IDLE_PCT TANDEM_BIN TANDEM_BUILD TANDEM_ARGS NBDKIT_ARGS QEMU_NBD_ARGS
bench_common_env
SERVERS_EXPLICIT=${SERVERS:+1}
SERVERS=${SERVERS:-tandem nbdkit qemu-nbd}

# ---------------------------------------------------------------- checks
bench_need fio fio python3 python3 nbdinfo libnbd-bin dd coreutils
fio --enghelp=nbd >/dev/null 2>&1 || die "this fio has no nbd ioengine"

RUN_SERVERS=()
TANDEM_SKIPPED=""
for s in $SERVERS; do
  case $s in
    tandem)
      if bench_tandem_bin; then
        RUN_SERVERS+=(tandem)
      elif [[ -n $SERVERS_EXPLICIT ]]; then
        die "tandem binary '$TANDEM_BIN' not found/not executable (SERVERS names tandem explicitly)"
      else
        TANDEM_SKIPPED="binary '$TANDEM_BIN' is absent and could not be built"
        log "WARNING: tandem binary '$TANDEM_BIN' is absent and could not be built;"
        log "WARNING: benchmarking only the peers. Set SERVERS=\"nbdkit qemu-nbd\" to silence this."
      fi
      ;;
    nbdkit)   bench_need nbdkit nbdkit; RUN_SERVERS+=(nbdkit) ;;
    qemu-nbd) bench_need qemu-nbd qemu-utils; RUN_SERVERS+=(qemu-nbd) ;;
    *) die "unknown server '$s' (known: tandem nbdkit qemu-nbd)" ;;
  esac
done
((${#RUN_SERVERS[@]} > 0)) || die "no servers to benchmark"

# ---------------------------------------------------------------- workdir
bench_workdir nbd-peers $((${#RUN_SERVERS[@]} * IMAGE_MB))

declare -A SOCK IMG SRV_CMD

cleanup() {
  local s
  bench_stop_all
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
bench_traps

wait_ready() { # name
  local s=$1 uri="nbd+unix:///?socket=${SOCK[$1]}" i size
  for ((i = 0; i < 300; i++)); do
    kill -0 "${PIDOF[$s]}" 2>/dev/null || { cat "$WORKDIR/logs/$s.log" >&2; die "$s exited during startup"; }
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
  bench_spawn "$s" "$WORKDIR/logs/$s.log" "${cmd[@]}"
  wait_ready "$s"
  log "$s ready (pid ${PIDOF[$s]}): ${SRV_CMD[$s]}"
}

# ---------------------------------------------------------------- prepare
bench_machine_start
log "workdir $WORKDIR; servers: ${RUN_SERVERS[*]}; jobs: ${JOB_LIST[*]}; runtime ${RUNTIME}s + ramp ${RAMP}s"
for s in "${RUN_SERVERS[@]}"; do
  log "writing ${IMAGE_MB} MiB of random data to $WORKDIR/$s.img"
  dd if=/dev/urandom of="$WORKDIR/$s.img" bs=1M count="$IMAGE_MB" conv=fsync status=none
done
bench_drop_caches
for s in "${RUN_SERVERS[@]}"; do start_server "$s"; done

# ---------------------------------------------------------------- run
RECORDS=$WORKDIR/records.tsv
: >"$RECORDS"
FIO_EXAMPLE="fio --name=JOB $FIO_COMMON <job args> --uri=$FIO_EXAMPLE_URI --output=FILE"

for job in "${JOB_LIST[@]}"; do
  for s in "${RUN_SERVERS[@]}"; do
    bench_run_job "$job" "$s" "nbd+unix:///?socket=${SOCK[$s]}" "${PIDOF[$s]:-0}"
  done
done

# Stop the servers now (not in the trap) to record how they exit on SIGTERM.
declare -A EXIT_RC
for s in "${RUN_SERVERS[@]}"; do
  if [[ -n ${PIDOF[$s]:-} ]]; then
    bench_stop "$s"
    EXIT_RC[$s]=$STOP_RC
  fi
done

# ---------------------------------------------------------------- report
stamp=$(date +%Y%m%d-%H%M%S)
mkdir -p "$RESULTS_DIR"
md=$RESULTS_DIR/nbd-peers-$stamp.md

tandem_ver="n/a"
if [[ " ${RUN_SERVERS[*]} " == *" tandem "* ]]; then
  tandem_ver="$(first_line "$TANDEM_BIN" --version)"
fi
bench_git_rev

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
  echo "| tandem | $tandem_ver, repo $GIT_REV |"
  echo "| nbdkit | $(first_line nbdkit --version) |"
  echo "| qemu-nbd | $(first_line qemu-nbd --version) |"
  bench_env_rows
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
