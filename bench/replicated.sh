#!/usr/bin/env bash
# replicated.sh — the replicated benchmark: fio (ioengine=nbd, over Unix
# sockets) against, in one run and interleaved job by job,
#
#   tandem       a replicated volume: three `tandem node` daemons, alpha and
#                beta diskful, gamma diskless and Primary (protocol C); fio
#                talks to gamma
#   nbdkit       one nbdkit file plugin, unreplicated (the baseline)
#   qemu-quorum  a user-space synchronous mirror: qemu-storage-daemon
#                exporting a quorum node (vote-threshold=2) whose two
#                children are NBD clients of two nbdkit file servers
#
# and print a Markdown table with ratios, CPU per I/O summed over all the
# processes of each server, and the issue's targets.
#
# This is a benchmark, not a test: it never fails on "slow" numbers.
# See bench/README.md for how to run it and what the columns mean.
#
# Environment (the first group as in nbd-peers.sh):
#   SERVERS      servers to run, in order (default "tandem nbdkit qemu-quorum")
#   TANDEM_BIN   tandem binary (default <repo>/target/release/tandem; built
#                with `cargo build --release -p tandem-cli` if missing)
#   TANDEM_BUILD =1 to always run the cargo build first
#   RUNTIME      measured seconds per job (default 15)
#   RAMP         fio ramp_time seconds per job (default 3)
#   JOBS         subset of jobs, space separated (default: all)
#   WORKDIR      where images/sockets go (default: mktemp -d /tmp)
#   KEEP_WORKDIR =1 to keep images, fio JSON and server logs
#   IMAGE_MB     volume size in MiB (default 1024)
#   RESULTS_DIR  where the .md goes (default <repo>/bench/results)
#   DROP_CACHES  1 (default) drops the page cache after the prefill, 0 keeps it
#   WAIT_IDLE    before each job wait up to this many seconds for the machine
#                to be idle (< IDLE_PCT % busy, default 25) (default 0: off)
# Replicated setup:
#   TANDEM_PROTOCOL  replication protocol A/B/C (default C)
#   TANDEM_IPS       the three nodes' addresses (default "127.0.0.31 127.0.0.32 127.0.0.33")
#   TANDEM_PORT      their replication port (default 7790)
#   TANDEM_ARGS      extra `tandem node` arguments (all three daemons)
#   TLS              TLS on tandem's peer links: off (default), secret (the
#                    resource's tls = "secret": no files) or certificates (a
#                    throwaway CA and node certificates made with openssl in
#                    $WORKDIR/conf/pki); compare a run with and without it
#   NBDKIT_ARGS      extra nbdkit arguments (the baseline and both quorum children)
#   QUORUM_READ_PATTERN  quorum read-pattern: fifo (default: read child 0) or
#                    quorum (read both children and compare)
#   QSD_ARGS         extra qemu-storage-daemon arguments
#   TARGETS          goals printed next to the ratios (fio_report.py --targets)
#   CHECK_REPLICAS   1 (default): compare the replicas (tandem's two disks, the
#                    quorum's two children) after every write job; 0: only at the end
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
BENCH_TAG=replicated
# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"
ORIG_CMD="$0${*:+ $*}"
bench_user_env SERVERS JOBS RUNTIME RAMP IMAGE_MB WORKDIR KEEP_WORKDIR RESULTS_DIR \
  DROP_CACHES WAIT_IDLE IDLE_PCT TANDEM_BIN TANDEM_BUILD TANDEM_PROTOCOL TANDEM_IPS \
  TANDEM_PORT TANDEM_ARGS TLS NBDKIT_ARGS QUORUM_READ_PATTERN QSD_ARGS TARGETS CHECK_REPLICAS
bench_common_env
SERVERS=${SERVERS:-tandem nbdkit qemu-quorum}
TANDEM_PROTOCOL=${TANDEM_PROTOCOL:-C}
TANDEM_IPS=${TANDEM_IPS:-127.0.0.31 127.0.0.32 127.0.0.33}
TANDEM_PORT=${TANDEM_PORT:-7790}
QUORUM_READ_PATTERN=${QUORUM_READ_PATTERN:-fifo}
CHECK_REPLICAS=${CHECK_REPLICAS:-1}
TLS=${TLS:-off}
# The issue's targets: tandem / peer.
TARGETS=${TARGETS:-randwrite16x2 iops qemu-quorum >= 3; randwrite16x2 iops nbdkit >= 0.8; randread16x2 iops nbdkit >= 0.9; randwrite1 lat_mean nbdkit <= 2; randwrite1fsync iops nbdkit >= 0.8}

NODES=(alpha beta gamma) # alpha, beta diskful; gamma diskless, Primary, serves NBD
DISKLESS=gamma

[[ $TANDEM_PROTOCOL =~ ^[ABC]$ ]] || die "TANDEM_PROTOCOL must be A, B or C"
[[ $TANDEM_PORT =~ ^[0-9]+$ ]] || die "TANDEM_PORT must be a port number"
read -ra IPS <<<"$TANDEM_IPS"
((${#IPS[@]} == 3)) || die "TANDEM_IPS must list three addresses"
[[ $QUORUM_READ_PATTERN == fifo || $QUORUM_READ_PATTERN == quorum ]] ||
  die "QUORUM_READ_PATTERN must be fifo or quorum"
[[ $TLS == off || $TLS == secret || $TLS == certificates ]] ||
  die "TLS must be off, secret or certificates"

# ---------------------------------------------------------------- checks
bench_need fio fio python3 python3 nbdinfo libnbd-bin nbdcopy libnbd-bin \
  dd coreutils truncate coreutils cmp diffutils
[[ $TLS != certificates ]] || bench_need openssl openssl
fio --enghelp=nbd >/dev/null 2>&1 || die "this fio has no nbd ioengine"

RUN_SERVERS=()
for s in $SERVERS; do
  case $s in
    tandem)
      bench_tandem_bin || die "tandem binary '$TANDEM_BIN' not found/not executable and could not be built"
      RUN_SERVERS+=(tandem)
      ;;
    nbdkit) bench_need nbdkit nbdkit; RUN_SERVERS+=(nbdkit) ;;
    qemu-quorum)
      # Debian ships qemu-storage-daemon in qemu-utils (older releases: qemu-system-common)
      bench_need nbdkit nbdkit qemu-storage-daemon qemu-utils
      RUN_SERVERS+=(qemu-quorum)
      ;;
    *) die "unknown server '$s' (known: tandem nbdkit qemu-quorum)" ;;
  esac
done
((${#RUN_SERVERS[@]} > 0)) || die "no servers to benchmark"
has_server() { [[ " ${RUN_SERVERS[*]} " == *" $1 "* ]]; }

# ---------------------------------------------------------------- workdir
# images: the random source, 2 tandem replicas, 1 nbdkit, 2 quorum children
need=$((IMAGE_MB))
has_server tandem && need=$((need + 2 * IMAGE_MB))
has_server nbdkit && need=$((need + IMAGE_MB))
has_server qemu-quorum && need=$((need + 2 * IMAGE_MB))
bench_workdir replicated "$need"
SIZE=$((IMAGE_MB * 1048576))

declare -A URI PIDS LABELS SRV_CMDS PREFILL REPLICAS REPLICA_DIFF
CHECKS=() # when the replicas were compared: "prefill", write jobs, "stop"
CREATED=() # files and directories made in a WORKDIR that is not ours

cleanup() {
  bench_stop_all
  bench_remove_workdir || true
}
bench_traps

# wait_nbd SERVER SOCK — until the export at SOCK answers with the right size.
wait_nbd() { bench_wait_nbd "$1" "$2" "$SIZE"; }

# ---------------------------------------------------------------- tandem
TDIR=$WORKDIR/tandem

# tandem_state — print one line per node (role, disk, peers); exit 0 when
# every peer link is Connected/Established, alpha and beta are UpToDate and
# nothing is out of sync.
tandem_state() {
  python3 "$SCRIPT_DIR/node_state.py" "$TANDEM_BIN" "$TDIR" --diskless "$DISKLESS" "${NODES[@]}"
}

# make_pki DIR — a throwaway CA (DIR/ca.pem) and, for each node, DIR/NODE-cert.pem
# and DIR/NODE-key.pem naming the node and its address (TLS=certificates).
make_pki() {
  local dir=$1 i n
  mkdir -p "$dir"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 \
    -subj "/CN=tandem bench CA" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" 2>/dev/null || die "openssl: cannot make the CA"
  for i in 0 1 2; do
    n=${NODES[i]}
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$n" \
      -keyout "$dir/$n-key.pem" -out "$dir/$n.csr" 2>/dev/null || die "openssl: cannot make $n's key"
    printf 'subjectAltName=DNS:%s,IP:%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\n' \
      "$n" "${IPS[i]}" >"$dir/$n.ext"
    openssl x509 -req -in "$dir/$n.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" \
      -CAcreateserial -days 7 -extfile "$dir/$n.ext" -out "$dir/$n-cert.pem" 2>/dev/null ||
      die "openssl: cannot sign $n's certificate"
  done
}

start_tandem() {
  local ip n i port_busy="" conf=$WORKDIR/conf/r0.toml
  if command -v ss >/dev/null; then
    for ip in "${IPS[@]}"; do
      if ss -Hltn "src $ip:$TANDEM_PORT" 2>/dev/null | grep -q .; then port_busy+=" $ip:$TANDEM_PORT"; fi
    done
    [[ -z $port_busy ]] || die "already in use:$port_busy (another tandem? set TANDEM_IPS / TANDEM_PORT)"
  fi
  mkdir -p "$TDIR" "$WORKDIR/conf"
  CREATED+=("$TDIR" "$WORKDIR/conf")
  rm -f -- "$TDIR"/*
  [[ $TLS != certificates ]] || make_pki "$WORKDIR/conf/pki"
  {
    echo "# Written by bench/replicated.sh: the same file for every node."
    echo "[resource]"
    echo "name = \"r0\""
    echo "protocol = \"$TANDEM_PROTOCOL\""
    echo "shared-secret = \"bench-replicated-$$\""
    [[ $TLS == off ]] || echo "tls = \"$TLS\""
    [[ $TLS != certificates ]] || echo "tls-ca = \"pki/ca.pem\""
    echo
    echo "[[volume]]"
    echo "number = 0"
    echo "size = \"${IMAGE_MB}M\""
    for i in 0 1 2; do
      n=${NODES[i]}
      echo
      echo "[[node]]"
      echo "name = \"$n\""
      echo "node-id = $i"
      echo "address = \"${IPS[i]}:$TANDEM_PORT\""
      if [[ $TLS == certificates ]]; then
        echo "tls-certificate = \"pki/$n-cert.pem\""
        echo "tls-key = \"pki/$n-key.pem\""
      fi
      echo "  [[node.volume]]"
      echo "  number = 0"
      if [[ $n == "$DISKLESS" ]]; then
        echo "  disk = \"none\""
        echo "  nbd = [\"unix:$TDIR/$n.sock\"]"
      else
        echo "  disk = \"$TDIR/$n.img\""
        echo "  nbd = []"
      fi
    done
  } >"$conf"
  local -a cmd
  local pids="" labels=""
  for n in "${NODES[@]}"; do
    # shellcheck disable=SC2206  # TANDEM_ARGS is deliberately word-split
    cmd=("$TANDEM_BIN" node --name "$n" --config-dir "$WORKDIR/conf" --control "$TDIR/$n.ctl" ${TANDEM_ARGS:-})
    add_cmd tandem "${cmd[@]}"
    bench_spawn "tandem.$n" "$WORKDIR/logs/tandem.$n.log" "${cmd[@]}"
    pids+=${pids:+,}${PIDOF[tandem.$n]}
    labels+=${labels:+,}$n
  done
  PIDS[tandem]=$pids
  LABELS[tandem]=$labels
  local state=""
  for ((i = 0; i < 300; i++)); do
    bench_alive "$pids" || { tail -n 30 "$WORKDIR/logs/tandem".*.log >&2 || true; die "a tandem node exited during startup"; }
    if state=$(tandem_state 2>&1); then break; fi
    sleep 0.1
  done
  ((i < 300)) || { echo "$state" >&2; die "tandem nodes not connected and UpToDate within 30 s"; }
  log "tandem nodes connected: $(echo "$state" | tr '\n' ' ')"
  "$TANDEM_BIN" primary r0 --control "$TDIR/$DISKLESS.ctl" >&2 || die "tandem primary r0 on $DISKLESS failed"
  add_cmd tandem "$TANDEM_BIN" primary r0 --control "$TDIR/$DISKLESS.ctl"
  URI[tandem]="nbd+unix:///?socket=$TDIR/$DISKLESS.sock"
  wait_nbd tandem "$TDIR/$DISKLESS.sock"
  REPLICAS[tandem]="$TDIR/alpha.img $TDIR/beta.img"
  log "tandem ready (pids $pids: ${labels//,/ }; fio on $DISKLESS)"
}

# ---------------------------------------------------------------- nbdkit
# start_nbdkit SERVER LABEL IMG SOCK — one nbdkit file plugin (part of SERVER)
start_nbdkit() {
  local s=$1 label=$2 img=$3 sock=$4
  truncate -s "$SIZE" "$img"
  rm -f -- "$sock"
  local -a cmd
  # shellcheck disable=SC2206  # NBDKIT_ARGS is deliberately word-split
  cmd=(nbdkit -U "$sock" -f ${NBDKIT_ARGS:-} file "$img")
  add_cmd "$s" "${cmd[@]}"
  bench_spawn "$label" "$WORKDIR/logs/$label.log" "${cmd[@]}"
  PIDS[$s]+=${PIDS[$s]:+,}${PIDOF[$label]}
}

start_nbdkit_baseline() {
  CREATED+=("$WORKDIR/nbdkit.img" "$WORKDIR/nbdkit.sock")
  start_nbdkit nbdkit nbdkit "$WORKDIR/nbdkit.img" "$WORKDIR/nbdkit.sock"
  URI[nbdkit]="nbd+unix:///?socket=$WORKDIR/nbdkit.sock"
  wait_nbd nbdkit "$WORKDIR/nbdkit.sock"
  log "nbdkit ready (pid ${PIDS[nbdkit]})"
}

# ---------------------------------------------------------------- qemu quorum
QDIR=$WORKDIR/quorum
start_quorum() {
  mkdir -p "$QDIR"
  CREATED+=("$QDIR")
  start_nbdkit qemu-quorum qemu-quorum.nbdkit-a "$QDIR/a.img" "$QDIR/a.sock"
  start_nbdkit qemu-quorum qemu-quorum.nbdkit-b "$QDIR/b.img" "$QDIR/b.sock"
  wait_nbd qemu-quorum "$QDIR/a.sock"
  wait_nbd qemu-quorum "$QDIR/b.sock"
  rm -f -- "$QDIR/quorum.sock"
  local -a cmd
  # Two NBD client nodes, a quorum node over them (a write completes when
  # both children completed it, and fails unless vote-threshold=2 of them
  # succeeded), exported over NBD. read-pattern=fifo reads child 0 (falling
  # back to child 1 on error), as a mirror does; "quorum" reads both and
  # compares.
  # shellcheck disable=SC2206  # QSD_ARGS is deliberately word-split
  cmd=(qemu-storage-daemon
    --blockdev "driver=nbd,node-name=child0,server.type=unix,server.path=$QDIR/a.sock"
    --blockdev "driver=nbd,node-name=child1,server.type=unix,server.path=$QDIR/b.sock"
    --blockdev "driver=quorum,node-name=mirror,vote-threshold=2,read-pattern=$QUORUM_READ_PATTERN,children.0=child0,children.1=child1"
    --nbd-server "addr.type=unix,addr.path=$QDIR/quorum.sock"
    --export "type=nbd,id=export0,node-name=mirror,name=,writable=on"
    ${QSD_ARGS:-})
  add_cmd qemu-quorum "${cmd[@]}"
  bench_spawn qemu-quorum.qsd "$WORKDIR/logs/qemu-quorum.qsd.log" "${cmd[@]}"
  # qsd first in the CPU split, then the two nbdkits
  PIDS[qemu-quorum]=${PIDOF[qemu-quorum.qsd]},${PIDS[qemu-quorum]}
  LABELS[qemu-quorum]=qsd,nbdkit-a,nbdkit-b
  URI[qemu-quorum]="nbd+unix:///?socket=$QDIR/quorum.sock"
  wait_nbd qemu-quorum "$QDIR/quorum.sock"
  REPLICAS[qemu-quorum]="$QDIR/a.img $QDIR/b.img"
  log "qemu-quorum ready (pids ${PIDS[qemu-quorum]}: qsd, nbdkit-a, nbdkit-b)"
}

# ---------------------------------------------------------------- prepare
bench_machine_start
log "workdir $WORKDIR; servers: ${RUN_SERVERS[*]}; jobs: ${JOB_LIST[*]}; runtime ${RUNTIME}s + ramp ${RAMP}s"
for s in "${RUN_SERVERS[@]}"; do
  case $s in
    tandem) start_tandem ;;
    nbdkit) start_nbdkit_baseline ;;
    qemu-quorum) start_quorum ;;
  esac
done

# Prefill: the same random data, written once through every server's own
# export (so tandem's replicas and the quorum's children are written by the
# replication itself), then checked on every replica file.
SRC=$WORKDIR/random.img
CREATED+=("$SRC")
log "writing ${IMAGE_MB} MiB of random data to $SRC"
dd if=/dev/urandom of="$SRC" bs=1M count="$IMAGE_MB" status=none
for s in "${RUN_SERVERS[@]}"; do
  log "prefill: nbdcopy --flush random.img -> $s"
  t0=$(now)
  nbdcopy --flush "$SRC" "${URI[$s]}" || die "prefill of $s failed"
  t1=$(now)
  PREFILL[$s]=$(awk -v a="$t0" -v b="$t1" -v mb="$IMAGE_MB" 'BEGIN { printf "%.1f s (%.0f MiB/s)", b - a, mb / (b - a) }')
  files=${REPLICAS[$s]:-$WORKDIR/$s.img}
  for f in $files; do
    # Only the volume: tandem's internal metadata follows it in the backing file.
    cmp -s -n "$SIZE" "$SRC" "$f" || die "$s: after the prefill $f differs from the data written"
  done
  log "  ${PREFILL[$s]}; identical on: ${files//$WORKDIR\//}"
  [[ -z ${REPLICAS[$s]:-} ]] || REPLICA_DIFF[$s.prefill]="0"
done
CHECKS+=(prefill)
rm -f -- "$SRC"
bench_drop_caches

# ---------------------------------------------------------------- run
RECORDS=$WORKDIR/records.tsv
: >"$RECORDS"
FIO_EXAMPLE="fio --name=JOB $FIO_COMMON <job args> --uri=$FIO_EXAMPLE_URI --output=FILE"

# compare_replicas WHEN — count differing 4 KiB blocks between each server's
# two replicas (O_DIRECT reads: the page cache is left alone). Between jobs
# nothing is in flight, so the replicas must be identical.
compare_replicas() {
  local when=$1 s nd nt sa sb
  CHECKS+=("$when")
  for s in "${RUN_SERVERS[@]}"; do
    [[ -n ${REPLICAS[$s]:-} && -z ${DEAD[$s]:-} ]] || continue
    # shellcheck disable=SC2086  # two file names
    read -r nd nt sa sb < <(python3 "$REPORT_PY" diffblocks --size "$SIZE" ${REPLICAS[$s]})
    REPLICA_DIFF[$s.$when]=$nd
    [[ $sa == "$sb" ]] || REPLICA_DIFF[$s.$when]+=" (sizes $sa, $sb)"
    ((nd == 0)) || log "WARNING: $s: $nd of $nt 4 KiB blocks differ between ${REPLICAS[$s]//$WORKDIR\//} ($when)"
  done
}

for job in "${JOB_LIST[@]}"; do
  for s in "${RUN_SERVERS[@]}"; do
    bench_run_job "$job" "$s" "${URI[$s]}" "${PIDS[$s]}" "${LABELS[$s]:-}"
  done
  if [[ $CHECK_REPLICAS == 1 && ${JOB_ARGS[$job]} == *write* ]]; then
    compare_replicas "$job"
  fi
done

# tandem's state after the run (before stopping), then stop every server
# (not in the trap) to record how its processes exit on SIGTERM.
TANDEM_END=""
if has_server tandem && [[ -z ${DEAD[tandem]:-} ]]; then
  if TANDEM_END=$(tandem_state 2>&1); then
    TANDEM_END="all peers connected, replicas UpToDate, nothing out of sync:"$'\n'"$TANDEM_END"
  else
    TANDEM_END="NOT all connected/UpToDate/in sync:"$'\n'"$TANDEM_END"
  fi
fi
declare -A EXIT_RC
for ((i = ${#STARTED[@]} - 1; i >= 0; i--)); do
  label=${STARTED[i]}
  [[ -n ${PIDOF[$label]:-} ]] || continue
  bench_stop "$label"
  EXIT_RC[$label]=$STOP_RC
done

# Are the replicas identical once everything is stopped (and flushed)?
DEAD=() # compare even a server that died
compare_replicas stop

# ---------------------------------------------------------------- report
stamp=$(date +%Y%m%d-%H%M%S)
mkdir -p "$RESULTS_DIR"
md=$RESULTS_DIR/replicated-$stamp.md
tandem_ver="n/a"
has_server tandem && tandem_ver="$(first_line "$TANDEM_BIN" --version)"
bench_git_rev
base_args=()
has_server tandem && base_args=(--base tandem --targets "$TARGETS")

{
  echo "# Replicated benchmark — $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo
  echo "Command (cwd \`$PWD\`): \`$USER_ENV$ORIG_CMD\`"
  echo
  echo "| | |"
  echo "|---|---|"
  echo "| fio | $(fio --version) |"
  echo "| tandem | $tandem_ver, repo $GIT_REV |"
  echo "| nbdkit | $(first_line nbdkit --version) |"
  echo "| qemu-storage-daemon | $(first_line qemu-storage-daemon --version) |"
  echo "| libnbd (nbdcopy) | $(first_line nbdcopy --version) |"
  bench_env_rows
  echo "| runtime | ${RUNTIME} s measured + ${RAMP} s ramp per job; ${IMAGE_MB} MiB volume per server |"
  prefill=""
  for s in "${RUN_SERVERS[@]}"; do prefill+="${prefill:+; }$s ${PREFILL[$s]}"; done
  echo "| prefill | the same random data through each server's export (\`nbdcopy --flush\`), checked on every replica file: $prefill |"
  echo "| page cache at start | ${CACHE_STATE} |"
  if has_server tandem; then
    echo "| tandem | protocol $TANDEM_PROTOCOL; peer-link TLS $TLS; alpha (${IPS[0]}) and beta (${IPS[1]}) diskful, gamma (${IPS[2]}) diskless Primary, port $TANDEM_PORT; fio on gamma's socket |"
  fi
  if has_server qemu-quorum; then
    echo "| qemu-quorum | vote-threshold=2, read-pattern=$QUORUM_READ_PATTERN, children: NBD clients of two nbdkit file servers |"
  fi
  echo
  echo "Servers (each on its own Unix socket and image files; all kept running, jobs interleaved):"
  echo
  for s in "${RUN_SERVERS[@]}"; do
    echo "- **$s**:"
    while IFS= read -r c; do
      [[ -n $c ]] && echo "  - \`${c//$WORKDIR/\$WORKDIR}\`"
    done <<<"${SRV_CMDS[$s]}"
  done
  echo
  exits=""
  for label in "${STARTED[@]}"; do exits+="${exits:+, }$label ${EXIT_RC[$label]:-?}"; done
  echo "Exit status on SIGTERM: $exits."
  echo
  if has_server tandem; then
    echo "tandem's resource file (\`\$WORKDIR/conf/r0.toml\`, the same for the three nodes):"
    echo
    echo '```toml'
    sed "s|$WORKDIR|\$WORKDIR|g" "$WORKDIR/conf/r0.toml"
    echo '```'
    echo
  fi
  echo "fio: \`$FIO_EXAMPLE\`, job args:"
  echo
  for j in "${JOB_LIST[@]}"; do echo "- $j: \`${JOB_ARGS[$j]}\`"; done
  echo
  python3 "$REPORT_PY" report "$RECORDS" "${base_args[@]}"
  echo "Latencies are fio completion latency (clat). Server CPU is utime+stime of all the"
  echo "server's processes (all threads; tandem: the three node daemons; qemu-quorum:"
  echo "qemu-storage-daemon and both nbdkits) over fio's measured period, per completed"
  echo "read/write; server CPU % is of one core. Host busy % is the whole machine's non-idle"
  echo "CPU over the same window, out of $(nproc)00 % (servers + fio + anything else running)."
  echo
  if ((${#REPLICA_DIFF[@]} > 0)); then
    echo "### Replica consistency"
    echo
    echo "Differing 4 KiB blocks between the two replicas of $((SIZE / 4096)) (tandem: alpha's and beta's"
    echo "disks; qemu-quorum: the two nbdkit files), compared between jobs (nothing in flight)"
    echo "and after the servers stopped. After the prefill every replica was checked against the data written."
    echo
    printf '| server |'
    for c in "${CHECKS[@]}"; do printf ' after %s |' "$c"; done
    printf '\n|---|'
    for c in "${CHECKS[@]}"; do printf -- '---:|'; done
    echo
    for s in "${RUN_SERVERS[@]}"; do
      [[ -n ${REPLICAS[$s]:-} ]] || continue
      printf '| %s |' "$s"
      for c in "${CHECKS[@]}"; do printf ' %s |' "${REPLICA_DIFF[$s.$c]:-n/a}"; done
      echo
    done
    echo
    if [[ -n $TANDEM_END ]]; then
      echo "tandem status at the end of the run:"
      echo
      echo '```'
      echo "$TANDEM_END"
      echo '```'
      echo
    fi
  fi
} | tee "$md"

log "results written to ${md}"
