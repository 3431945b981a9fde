#!/usr/bin/env bash
# sparse-copy.sh — copy a sparse volume out over NBD (issue 17, part 1): a
# SIZE (default 16 GiB) volume holding DATA (default 1 GiB) of random data in
# many pieces, copied to a fresh local file with `nbdcopy` and with
# `qemu-img convert`, from, in one run and interleaved copy by copy,
#
#   tandem       `tandem serve --socket SOCK FILE`
#   nbdkit       `nbdkit -U SOCK -f file FILE` (the baseline)
#   qemu-nbd     `qemu-nbd -k SOCK -f raw ... -t FILE`
#   tandem-node  two `tandem node` daemons (alpha, beta, both diskful,
#                protocol C on loopback); alpha is Primary and exports the
#                volume; the data was written through it (not timed)
#
# Every server answers NBD block status (base:allocation), so the tools can
# skip the holes. Measured per copy: wall time, bytes the server processes
# read (/proc/PID/io rchar), their CPU time, and the copy's allocated size;
# the copy is compared with the source. Prints a Markdown table with the
# median of ROUNDS rounds and the ratios to nbdkit (issue 17's target:
# tandem within 1.2× of nbdkit's time).
#
# This is a benchmark, not a test: it never fails on "slow" numbers.
# See bench/README.md for how to run it and what the columns mean.
#
# Environment:
#   SIZE         volume size (default 16G; K/M/G/T suffixes, a multiple of 1 MiB)
#   DATA         random data in it (default 1G)
#   PIECES       sizes the data pieces cycle through (default "4M 1M 256K 64K";
#                multiples of 64 KiB), spread evenly over the volume
#   ROUNDS       rounds (default 3); each round copies once per tool and server
#   SERVERS      servers, in order (default "tandem nbdkit qemu-nbd tandem-node")
#   TOOLS        copy tools, in order (default "nbdcopy qemu-img")
#   CACHE        warm (default): the server's image is read into the page cache
#                before every copy (untimed); cold: `echo 3 >
#                /proc/sys/vm/drop_caches` before every copy
#   VERIFY       all (default): compare every copy with the source; first: only
#                round 1's; none
#   COUNT        1 (default): after the rounds, one more untimed copy per tool
#                and server through an nbdkit proxy logging every request (the
#                NBD reads and block status requests the tool made); 0: no
#   TANDEM_BIN   tandem binary (default <repo>/target/release/tandem; built
#                with `cargo build --release -p tandem-cli` if missing)
#   TANDEM_BUILD =1 to always run the cargo build first
#   TANDEM_ARGS / NBDKIT_ARGS / QEMU_NBD_ARGS  extra server arguments
#                (TANDEM_ARGS: `tandem serve` and both `tandem node`s)
#   NBDCOPY_ARGS / QEMU_IMG_ARGS  extra arguments of the copy tools
#   TANDEM_IPS   tandem-node's alpha and beta addresses (default
#                "127.0.0.61 127.0.0.62"), TANDEM_PORT (default 7793)
#   WORKDIR      images, sockets, logs (default: mktemp -d /tmp)
#   KEEP_WORKDIR =1 to keep it
#   RESULTS_DIR  where the .md goes (default <repo>/bench/results)
#   WAIT_IDLE, IDLE_PCT  as in nbd-peers.sh (wait for an idle machine before
#                every copy)
#   NOTE         a sentence printed at the top of the report (e.g. the load)
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
BENCH_TAG=sparse-copy
# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"
HELPER="$SCRIPT_DIR/sparse_copy.py"
ORIG_CMD="$0${*:+ $*}"
bench_user_env SIZE DATA PIECES ROUNDS SERVERS TOOLS CACHE VERIFY COUNT TANDEM_BIN TANDEM_BUILD \
  TANDEM_ARGS NBDKIT_ARGS QEMU_NBD_ARGS NBDCOPY_ARGS QEMU_IMG_ARGS TANDEM_IPS TANDEM_PORT \
  WORKDIR KEEP_WORKDIR RESULTS_DIR WAIT_IDLE IDLE_PCT

SIZE=${SIZE:-16G}
DATA=${DATA:-1G}
PIECES=${PIECES:-4M 1M 256K 64K}
ROUNDS=${ROUNDS:-3}
SERVERS=${SERVERS:-tandem nbdkit qemu-nbd tandem-node}
TOOLS=${TOOLS:-nbdcopy qemu-img}
CACHE=${CACHE:-warm}
VERIFY=${VERIFY:-all}
COUNT=${COUNT:-1}
TANDEM_BIN=${TANDEM_BIN:-$REPO/target/release/tandem}
TANDEM_IPS=${TANDEM_IPS:-127.0.0.61 127.0.0.62}
TANDEM_PORT=${TANDEM_PORT:-7793}
RESULTS_DIR=${RESULTS_DIR:-$REPO/bench/results}
KEEP_WORKDIR=${KEEP_WORKDIR:-0}
WAIT_IDLE=${WAIT_IDLE:-0}
IDLE_PCT=${IDLE_PCT:-25}
NOTE=${NOTE:-}

bytes_of() { numfmt --from=iec "$1" 2>/dev/null || die "bad size '$1' (want e.g. 16G, 512M)"; }
SIZE_B=$(bytes_of "$SIZE")
DATA_B=$(bytes_of "$DATA")
PIECES_B=""
for p in $PIECES; do PIECES_B+="$(bytes_of "$p") "; done
((SIZE_B > 0 && SIZE_B % 1048576 == 0)) || die "SIZE must be a positive multiple of 1 MiB"
((DATA_B > 0 && DATA_B < SIZE_B)) || die "DATA must be > 0 and < SIZE"
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer"
[[ $CACHE == warm || $CACHE == cold ]] || die "CACHE must be warm or cold"
[[ $VERIFY =~ ^(all|first|none)$ ]] || die "VERIFY must be all, first or none"
[[ $COUNT == 0 || $COUNT == 1 ]] || die "COUNT must be 0 or 1"
[[ $WAIT_IDLE =~ ^[0-9]+$ ]] || die "WAIT_IDLE must be an integer (seconds)"
[[ $TANDEM_PORT =~ ^[0-9]+$ ]] || die "TANDEM_PORT must be a port number"
read -ra IPS <<<"$TANDEM_IPS"
((${#IPS[@]} == 2)) || die "TANDEM_IPS must list two addresses (alpha, beta)"
if [[ $CACHE == cold ]]; then
  [[ -w /proc/sys/vm/drop_caches ]] || die "CACHE=cold needs root (echo 3 > /proc/sys/vm/drop_caches)"
fi
DATA_MB=$(((DATA_B + 1048575) / 1048576))

# ---------------------------------------------------------------- checks
bench_need python3 python3 nbdinfo libnbd-bin numfmt coreutils truncate coreutils
RUN_SERVERS=()
for s in $SERVERS; do
  case $s in
    tandem | tandem-node)
      bench_tandem_bin || die "tandem binary '$TANDEM_BIN' not found/not executable and could not be built"
      ;;
    nbdkit) bench_need nbdkit nbdkit ;;
    qemu-nbd) bench_need qemu-nbd qemu-utils ;;
    *) die "unknown server '$s' (known: tandem nbdkit qemu-nbd tandem-node)" ;;
  esac
  [[ " ${RUN_SERVERS[*]} " != *" $s "* ]] || die "server '$s' named twice"
  RUN_SERVERS+=("$s")
done
((${#RUN_SERVERS[@]} > 0)) || die "no servers to benchmark"
has_server() { [[ " ${RUN_SERVERS[*]} " == *" $1 "* ]]; }
has_server tandem-node && bench_need nbdcopy libnbd-bin
[[ $COUNT == 0 ]] || bench_need nbdkit nbdkit
RUN_TOOLS=()
for t in $TOOLS; do
  case $t in
    nbdcopy) bench_need nbdcopy libnbd-bin ;;
    qemu-img) bench_need qemu-img qemu-utils ;;
    *) die "unknown tool '$t' (known: nbdcopy qemu-img)" ;;
  esac
  RUN_TOOLS+=("$t")
done
((${#RUN_TOOLS[@]} > 0)) || die "no copy tools"

# ---------------------------------------------------------------- workdir
# the source, one image per server (two replicas for tandem-node), one copy
# at a time
need=$((DATA_MB * 2))
for s in "${RUN_SERVERS[@]}"; do
  need=$((need + DATA_MB))
  [[ $s != tandem-node ]] || need=$((need + DATA_MB + 64))
done
bench_workdir sparse-copy "$need"

declare -A URI PIDS SRV_CMDS IMG_DESC IMG_OF MULTI_CONN EXIT_RC
CREATED=() # files and directories made in a WORKDIR that is not ours
DEST=$WORKDIR/copy.img

cleanup() {
  bench_stop_all
  bench_remove_workdir || true
}
bench_traps

# wait_nbd SERVER SOCK — until the export at SOCK answers with the right size.
wait_nbd() { bench_wait_nbd "$1" "$2" "$SIZE_B"; }

# describe_img SERVER FILE — data ranges and allocation of the image, for the report.
describe_img() {
  local s=$1 f=$2 nr nb alloc
  read -r nr nb < <(python3 "$HELPER" map "$f" "$SIZE_B")
  alloc=$(($(stat -c '%b * %B' "$f")))
  IMG_DESC[$s]="${f//$WORKDIR/\$WORKDIR}: $nr data ranges, $((nb / 1048576)) MiB of data (SEEK_DATA), $((alloc / 1048576)) MiB allocated (st_blocks), file size $(stat -c %s "$f")"
}

# ---------------------------------------------------------------- single servers
start_single() {
  local s=$1 sock=$WORKDIR/$1.sock img=$WORKDIR/$1.img
  CREATED+=("$sock" "$img")
  cp --sparse=always -- "$SRC" "$img"
  rm -f -- "$sock"
  local -a cmd
  # shellcheck disable=SC2206  # *_ARGS are deliberately word-split
  case $s in
    tandem) cmd=("$TANDEM_BIN" serve --socket "$sock" ${TANDEM_ARGS:-} "$img") ;;
    nbdkit) cmd=(nbdkit -U "$sock" -f ${NBDKIT_ARGS:-} file "$img") ;;
    qemu-nbd) cmd=(qemu-nbd -k "$sock" -f raw --cache=writeback --aio=threads -x '' -e 16 -t ${QEMU_NBD_ARGS:-} "$img") ;;
  esac
  add_cmd "$s" "${cmd[@]}"
  bench_spawn "$s" "$WORKDIR/logs/$s.log" "${cmd[@]}"
  PIDS[$s]=${PIDOF[$s]}
  URI[$s]="nbd+unix:///?socket=$sock"
  wait_nbd "$s" "$sock"
  python3 "$HELPER" cmp "$SRC" "$img" "$SIZE_B" >/dev/null || die "$s: $img differs from the source"
  describe_img "$s" "$img"
  IMG_OF[$s]=$img
  log "$s ready (pid ${PIDS[$s]}): ${IMG_DESC[$s]}"
}

# ---------------------------------------------------------------- tandem-node
NDIR=$WORKDIR/tandem-node
NODES=(alpha beta) # both diskful; alpha is Primary and serves NBD

# node_state — one line per node; exit 0 when both are UpToDate, the peer
# link Connected/Established and nothing out of sync.
node_state() {
  python3 "$SCRIPT_DIR/node_state.py" "$TANDEM_BIN" "$NDIR" "${NODES[@]}"
}

wait_node_state() {
  local i state=""
  for ((i = 0; i < 600; i++)); do
    bench_alive "${PIDS[tandem-node]}" || { tail -n 30 "$WORKDIR/logs/tandem-node".*.log >&2 || true; die "a tandem node exited"; }
    if state=$(node_state 2>&1); then
      NODE_STATE=$state
      return 0
    fi
    sleep 0.1
  done
  echo "$state" >&2
  die "tandem-node: nodes not connected, UpToDate and in sync within 60 s ($1)"
}

start_node() {
  local ip n i port_busy="" conf=$NDIR/conf/r0.toml
  if command -v ss >/dev/null; then
    for ip in "${IPS[@]}"; do
      if ss -Hltn "src $ip:$TANDEM_PORT" 2>/dev/null | grep -q .; then port_busy+=" $ip:$TANDEM_PORT"; fi
    done
    [[ -z $port_busy ]] || die "already in use:$port_busy (another tandem? set TANDEM_IPS / TANDEM_PORT)"
  fi
  mkdir -p "$NDIR/conf"
  CREATED+=("$NDIR")
  rm -f -- "$NDIR"/*.img "$NDIR"/*.ctl "$NDIR"/*.sock
  {
    echo "# Written by bench/sparse-copy.sh: the same file for both nodes."
    echo "[resource]"
    echo "name = \"r0\""
    echo "protocol = \"C\""
    echo "shared-secret = \"bench-sparse-copy-$$\""
    echo
    echo "[[volume]]"
    echo "number = 0"
    echo "size = \"$((SIZE_B / 1048576))M\""
    for i in 0 1; do
      n=${NODES[i]}
      echo
      echo "[[node]]"
      echo "name = \"$n\""
      echo "node-id = $i"
      echo "address = \"${IPS[i]}:$TANDEM_PORT\""
      echo "  [[node.volume]]"
      echo "  number = 0"
      echo "  disk = \"$NDIR/$n.img\""
      if [[ $n == alpha ]]; then
        echo "  nbd = [\"unix:$NDIR/$n.sock\"]"
      else
        echo "  nbd = []"
      fi
    done
  } >"$conf"
  local -a cmd
  local pids=""
  for n in "${NODES[@]}"; do
    # shellcheck disable=SC2206  # TANDEM_ARGS is deliberately word-split
    cmd=("$TANDEM_BIN" node --name "$n" --config-dir "$NDIR/conf" --control "$NDIR/$n.ctl" ${TANDEM_ARGS:-})
    add_cmd tandem-node "${cmd[@]}"
    bench_spawn "tandem-node.$n" "$WORKDIR/logs/tandem-node.$n.log" "${cmd[@]}"
    pids+=${pids:+,}${PIDOF[tandem-node.$n]}
  done
  PIDS[tandem-node]=$pids
  wait_node_state "start-up"
  log "tandem-node connected: $(echo "$NODE_STATE" | tr '\n' ' ')"
  "$TANDEM_BIN" primary r0 --control "$NDIR/alpha.ctl" >&2 || die "tandem primary r0 on alpha failed"
  add_cmd tandem-node "$TANDEM_BIN" primary r0 --control "$NDIR/alpha.ctl"
  URI[tandem-node]="nbd+unix:///?socket=$NDIR/alpha.sock"
  wait_nbd tandem-node "$NDIR/alpha.sock"
  # The data, written through the Primary (so both replicas get it by
  # replication); the holes are left alone (the new volume reads as zeroes).
  log "tandem-node: writing the data through alpha (nbdcopy --destination-is-zero --flush; not timed)"
  local t0 t1
  t0=$(now)
  nbdcopy --destination-is-zero --flush "$SRC" "${URI[tandem-node]}" || die "tandem-node: writing the data failed"
  t1=$(now)
  NODE_FILL=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f s", b - a }')
  SRV_CMDS[tandem-node]+="nbdcopy --destination-is-zero --flush \$WORKDIR/source.img ${URI[tandem-node]//$WORKDIR/\$WORKDIR}   # the data (not timed)"$'\n'
  wait_node_state "after writing the data"
  for n in "${NODES[@]}"; do
    python3 "$HELPER" cmp "$SRC" "$NDIR/$n.img" "$SIZE_B" >/dev/null ||
      die "tandem-node: $n's replica differs from the source after writing the data"
  done
  describe_img tandem-node "$NDIR/alpha.img"
  IMG_DESC[tandem-node]+=" (the volume's first $SIZE_B bytes; internal metadata follows); beta's replica identical; data written in $NODE_FILL"
  IMG_OF[tandem-node]=$NDIR/alpha.img
  log "tandem-node ready (pids $pids: alpha beta; alpha Primary): ${IMG_DESC[tandem-node]}"
}

# ---------------------------------------------------------------- copies
# counters PIDS — "<rchar> <read_bytes> <utime+stime+cutime+cstime ticks>"
# summed over the processes (each line of /proc/PID/io and stat covers all
# of a process's threads, the exited ones included).
counters() {
  local p rc=0 rb=0 tk=0 k v st
  local -a f
  for p in ${1//,/ }; do
    # (bash arithmetic: awk would print large counts in floating point)
    [[ -r /proc/$p/io ]] || continue
    while read -r k v; do
      case $k in
        rchar:) rc=$((rc + v)) ;;
        read_bytes:) rb=$((rb + v)) ;;
      esac
    done < <(cat "/proc/$p/io" 2>/dev/null)
    st=$(cat "/proc/$p/stat" 2>/dev/null) || continue
    read -ra f <<<"${st##*) }" # fields from 3 (state) on: utime is f[11]
    tk=$((tk + f[11] + f[12] + f[13] + f[14]))
  done
  echo "$rc $rb $tk"
}

# copy_cmd TOOL URI — CMD: the copy of URI to $DEST (created here for nbdcopy,
# which writes into an existing file; qemu-img convert creates it).
copy_cmd() {
  rm -f -- "$DEST"
  # shellcheck disable=SC2206  # *_ARGS are deliberately word-split
  case $1 in
    nbdcopy)
      truncate -s "$SIZE_B" "$DEST"
      CMD=(nbdcopy ${NBDCOPY_ARGS:-} "$2" "$DEST")
      ;;
    qemu-img) CMD=(qemu-img convert -f raw -O raw ${QEMU_IMG_ARGS:-} "$2" "$DEST") ;;
  esac
}

# count_once TOOL SERVER — one more, untimed copy through an nbdkit proxy
# logging every request (`--filter=log nbd`): what the tool asked the server
# for. Appends to $COUNTS.
count_once() {
  local tool=$1 s=$2 psock=$WORKDIR/count.sock plog=$WORKDIR/logs/count.$1.$2.log rc=0 i
  [[ -z ${DEAD[$s]:-} ]] || return 0
  local upstream=${URI[$s]#nbd+unix:///?socket=}
  rm -f -- "$psock" "$plog"
  bench_spawn count-proxy "$WORKDIR/logs/count-proxy.out" \
    nbdkit -U "$psock" -f --filter=log nbd socket="$upstream" logfile="$plog"
  for ((i = 0; i < 100; i++)); do
    [[ -S $psock ]] && nbdinfo --size "nbd+unix:///?socket=$psock" >/dev/null 2>&1 && break
    kill -0 "${PIDOF[count-proxy]}" 2>/dev/null || break
    sleep 0.1
  done
  copy_cmd "$tool" "nbd+unix:///?socket=$psock"
  "${CMD[@]}" >"$WORKDIR/logs/count.$tool.$s.out" 2>&1 || rc=$?
  bench_stop count-proxy
  rm -f -- "$DEST" "$psock"
  local n
  n=$(python3 "$HELPER" nbdlog "$plog" 2>/dev/null) || n="0 0 0 0 0"
  printf '%s\t%s\t%s\t%s\n' "$tool" "$s" "$rc" "${n// /$'\t'}" >>"$COUNTS"
  log "requests of $tool from $s (through the logging proxy; exit $rc): reads, bytes, block status requests, bytes asked about, failed: $n"
}

declare -A DEAD=()
# copy ROUND TOOL SERVER — one timed copy; appends a record to $RECORDS.
copy_once() {
  local r=$1 tool=$2 s=$3 uri=${URI[$3]} rc=0 t0 t1 c0 c1 alloc=0 verify="-" nd
  rm -f -- "$DEST"
  if [[ -n ${DEAD[$s]:-} ]]; then
    printf '%s\t%s\t%s\t99\t0\t0\t0\t0\t%s\t0\t-\n' "$r" "$tool" "$s" "$CLK_TCK" >>"$RECORDS"
    return 0
  fi
  copy_cmd "$tool" "$uri"
  sync # the previous copy's dirty pages go to disk before this one
  if [[ $CACHE == warm ]]; then
    # again before every copy: the kernel may have evicted some of it since
    # (e.g. DAMON's proactive reclaim pages out what stayed idle for a while)
    python3 "$HELPER" warm "${IMG_OF[$s]}" "$SIZE_B"
  else
    echo 3 >/proc/sys/vm/drop_caches
  fi
  wait_idle
  read -ra c0 < <(counters "${PIDS[$s]}")
  t0=$(now)
  "${CMD[@]}" >"$WORKDIR/logs/copy.$r.$tool.$s.out" 2>&1 || rc=$?
  t1=$(now)
  read -ra c1 < <(counters "${PIDS[$s]}")
  if ! bench_alive "${PIDS[$s]}"; then
    DEAD[$s]=1
    log "ERROR: $s died during the copy; its remaining copies are skipped"
    tail -n 20 "$WORKDIR/logs/$s".*log >&2 || true
    rc=98
  fi
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
  if ((rc != 0)); then
    log "round $r: $tool from $s FAILED (exit $rc):"
    tail -n 5 "$WORKDIR/logs/copy.$r.$tool.$s.out" >&2 || true
  else
    alloc=$(($(stat -c '%b * %B' "$DEST")))
    if [[ $VERIFY == all || ($VERIFY == first && $r == 1) ]]; then
      nd=$(python3 "$HELPER" cmp "$SRC" "$DEST" "$SIZE_B" | cut -d' ' -f1) || true
      if [[ $nd == 0 ]]; then verify=ok; else
        verify="${nd:-?} blocks differ"
        log "WARNING: round $r: the copy by $tool from $s differs from the source in ${nd:-?} 4 KiB blocks"
      fi
    fi
    log "round $r: $tool from $s: ${secs} s, server read $(((c1[0] - c0[0]) / 1048576)) MiB, copy allocates $((alloc / 1048576)) MiB, check: $verify"
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$tool" "$s" "$rc" "$secs" \
    $((c1[0] - c0[0])) $((c1[1] - c0[1])) $((c1[2] - c0[2])) "$CLK_TCK" "$alloc" "$verify" >>"$RECORDS"
  rm -f -- "$DEST"
}

# ---------------------------------------------------------------- prepare
bench_machine_start
log "workdir $WORKDIR; servers: ${RUN_SERVERS[*]}; tools: ${RUN_TOOLS[*]}; $ROUNDS round(s); cache $CACHE"
SRC=$WORKDIR/source.img
CREATED+=("$SRC" "$DEST")
log "writing the source: $DATA of random data in pieces of $PIECES over $SIZE"
read -r NPIECES STRIDE DATA_W < <(python3 "$HELPER" layout "$SRC" "$SIZE_B" "$DATA_B" "$PIECES_B")
describe_img source "$SRC"
log "source: $NPIECES pieces, one every $((STRIDE / 1048576)) MiB; ${IMG_DESC[source]}"
for s in "${RUN_SERVERS[@]}"; do
  case $s in
    tandem-node) start_node ;;
    *) start_single "$s" ;;
  esac
  nbdinfo --can multi-conn "${URI[$s]}" 2>/dev/null && MULTI_CONN[$s]=yes || MULTI_CONN[$s]=no
done
sync
if [[ $CACHE == warm ]]; then
  CACHE_STATE="warm: the server's image (its data ranges) read just before each copy, untimed; nothing dropped"
else
  CACHE_STATE="cold: \`sync; echo 3 > /proc/sys/vm/drop_caches\` before every copy"
fi

# ---------------------------------------------------------------- run
RECORDS=$WORKDIR/records.tsv
: >"$RECORDS"
for ((r = 1; r <= ROUNDS; r++)); do
  for tool in "${RUN_TOOLS[@]}"; do
    for s in "${RUN_SERVERS[@]}"; do
      copy_once "$r" "$tool" "$s"
    done
  done
done
COUNTS=$WORKDIR/counts.tsv
: >"$COUNTS"
if [[ $COUNT == 1 ]]; then
  for tool in "${RUN_TOOLS[@]}"; do
    for s in "${RUN_SERVERS[@]}"; do
      count_once "$tool" "$s"
    done
  done
fi

# tandem-node's state after the copies, then stop every server (not in the
# trap) to record how it exits on SIGTERM.
NODE_END=""
if has_server tandem-node && [[ -z ${DEAD[tandem-node]:-} ]]; then
  for ((i = 0; i < 50; i++)); do
    if NODE_END=$(node_state 2>&1); then break; fi
    sleep 0.1
  done
  if ((i < 50)); then
    NODE_END="both UpToDate, connected, nothing out of sync:"$'\n'"$NODE_END"
  else
    NODE_END="NOT both UpToDate, connected and in sync:"$'\n'"$NODE_END"
  fi
fi
for ((i = ${#STARTED[@]} - 1; i >= 0; i--)); do
  label=${STARTED[i]}
  [[ -n ${PIDOF[$label]:-} ]] || continue
  bench_stop "$label"
  EXIT_RC[$label]=$STOP_RC
done

# ---------------------------------------------------------------- report
stamp=$(date +%Y%m%d-%H%M%S)
mkdir -p "$RESULTS_DIR"
md=$RESULTS_DIR/sparse-copy-$stamp.md
tandem_ver="n/a"
if has_server tandem || has_server tandem-node; then tandem_ver="$(first_line "$TANDEM_BIN" --version)"; fi
bench_git_rev
base=nbdkit
has_server nbdkit || base=${RUN_SERVERS[0]}

{
  echo "# Sparse copy-out benchmark — $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo
  [[ -z $NOTE ]] || { echo "> $NOTE"; echo; }
  echo "Command (cwd \`$PWD\`): \`$USER_ENV$ORIG_CMD\`"
  echo
  echo "| | |"
  echo "|---|---|"
  echo "| tandem | $tandem_ver, repo $GIT_REV |"
  echo "| nbdkit | $(first_line nbdkit --version) |"
  echo "| qemu-nbd | $(first_line qemu-nbd --version) |"
  echo "| qemu-img | $(first_line qemu-img --version) |"
  echo "| nbdcopy | $(first_line nbdcopy --version) |"
  bench_env_rows
  echo "| volume | $SIZE ($SIZE_B bytes) holding $DATA_W bytes of random data: $NPIECES pieces cycling through sizes $PIECES, piece i at offset i × $((STRIDE / 1048576)) MiB |"
  echo "| rounds | $ROUNDS; in each round every tool copies from every server, servers back to back per tool |"
  echo "| page cache | $CACHE_STATE |"
  damon=""
  for k in /sys/kernel/mm/damon/admin/kdamonds/*/; do
    [[ -r $k/state && $(cat "$k/state" 2>/dev/null) == on ]] || continue
    damon+="${damon:+; }kdamond $(basename "$k") on, schemes: $(cat "$k"/contexts/*/schemes/*/action 2>/dev/null | sort | uniq | tr '\n' ' ')"
  done
  [[ -z $damon ]] || echo "| DAMON | ${damon% } (proactive reclaim can evict idle page cache) |"
  echo
  echo "Servers (each on its own Unix socket and copy of the image; all kept running):"
  echo
  for s in "${RUN_SERVERS[@]}"; do
    echo "- **$s** (multi-conn advertised: ${MULTI_CONN[$s]}):"
    while IFS= read -r c; do
      [[ -n $c ]] && echo "  - \`${c//$WORKDIR/\$WORKDIR}\`"
    done <<<"${SRV_CMDS[$s]}"
    echo "  - image: ${IMG_DESC[$s]}"
  done
  echo
  exits=""
  for label in "${STARTED[@]}"; do
    [[ $label == count-proxy ]] || exits+="${exits:+, }$label ${EXIT_RC[$label]:-?}"
  done
  echo "Exit status on SIGTERM: $exits."
  echo
  echo "Copies (\`\$DEST\` on the workdir's file system, removed after each copy; \`sync\` before each, untimed):"
  echo
  for t in "${RUN_TOOLS[@]}"; do
    case $t in
      nbdcopy) echo "- \`truncate -s $SIZE_B \$DEST\` (untimed), then \`nbdcopy${NBDCOPY_ARGS:+ $NBDCOPY_ARGS} nbd+unix:///?socket=SOCK \$DEST\`" ;;
      qemu-img) echo "- \`qemu-img convert -f raw -O raw${QEMU_IMG_ARGS:+ $QEMU_IMG_ARGS} nbd+unix:///?socket=SOCK \$DEST\` (creates \$DEST)" ;;
    esac
  done
  echo
  echo "### Results"
  echo
  python3 "$HELPER" report "$RECORDS" --counts "$COUNTS" --base "$base" --target 1.2
  echo "Time: wall time of the copy command (connect, block status, reads, writes to the"
  echo "local file, exit); neither tool syncs the copy. Bytes read: increase of \`rchar\` in"
  echo "/proc/PID/io of the server's processes over the copy (tandem-node: alpha and beta"
  echo "summed) — the bytes their read-family system calls returned, page cache hits included"
  echo "(and, when read(2) is used on sockets, the requests received: a few bytes each). Disk"
  echo "read: \`read_bytes\` of the same, what had to come from the block device. Server CPU:"
  echo "utime + stime of the same processes over the copy. Dest allocated: st_blocks × 512 of"
  echo "the copy. Medians over the rounds; ratios are server / $base per tool."
  echo
  if [[ -n $NODE_END ]]; then
    echo "tandem-node status after the copies:"
    echo
    echo '```'
    echo "$NODE_END"
    echo '```'
    echo
  fi
} | tee "$md"

log "results written to ${md}"
