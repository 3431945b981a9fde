#!/usr/bin/env bash
# resync-load.sh — what a resync costs the application (issue 14, item 4): the
# latency of 4k random writes at iodepth 1 through a diskless Primary (gamma),
# first with both diskful replicas in sync, then while beta, thrown away with
# `tandem invalidate`, is synced in full from alpha. Variants (VARIANTS, default
# "paced unpaced"), one after the other on fresh volumes:
#
#   paced     resync-min-rate = "32M" (the default): at least 32 MiB/s while the
#             application writes, the resync controller's rate above that
#   unpaced   resync-min-rate = "0": as fast as 2 MiB in flight goes
#   min1m     resync-min-rate = "1M", the controller's defaults
#   ctl       resync-min-rate = "1M", resync-delay-target = "100ms" (the controller
#             with a delay target above a 256 KiB request's time on a 40 Mbit/s link)
#   fixed     resync-min-rate = "1M", resync-plan-ahead = "0s" (no controller: the
#             minimum under load)
#
# LINK=lo (the default) runs the nodes on 127.0.0.x; LINK=tbf puts each node in its
# own network namespace cabled to a bridge (needs root, ip, tc) and limits what
# reaches beta to LINK_RATE (default 40mbit) with `tc ... tbf burst 32kbit latency
# 400ms` after the prefill: the resync and the Primary's writes to beta share it.
#
# LOAD=qd1 (the default) writes at iodepth 1; LOAD=half measures the unloaded IOPS
# at iodepth 16 first and then writes at iodepth 16 held to half of them (fio
# rate_iops), idle and during the resync: the issue's "steady foreground random-write
# load at half the unloaded IOPS".
#
# It prints a Markdown table (mean and p99 write latency idle and during the
# resync, their ratio, how long the resync took) and writes it to
# bench/results/; beta's log of each variant is kept in
# $TMPDIR/resync-load-beta-VARIANT.log. A benchmark, not a test: it never fails on
# slow numbers.
#
#   bench/resync-load.sh
#   IMAGE_MB=1024 RUNTIME=12 VARIANTS="paced unpaced" LOAD=half TANDEM_BIN=... bench/resync-load.sh
#   LINK=tbf IMAGE_MB=64 VARIANTS="ctl min1m fixed unpaced" bench/resync-load.sh
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
IMAGE_MB=${IMAGE_MB:-1024}
RUNTIME=${RUNTIME:-12}
VARIANTS=${VARIANTS:-paced unpaced}
LOAD=${LOAD:-qd1}
case $LOAD in qd1 | half) ;; *) echo "LOAD must be qd1 or half" >&2; exit 1 ;; esac
LINK=${LINK:-lo}
LINK_RATE=${LINK_RATE:-40mbit}
case $LINK in lo | tbf) ;; *) echo "LINK must be lo or tbf" >&2; exit 1 ;; esac
TANDEM_BIN=${TANDEM_BIN:-$REPO/target/release/tandem}
RESULTS_DIR=${RESULTS_DIR:-$REPO/bench/results}
PORT=${TANDEM_PORT:-7792}
IPS=(127.0.0.51 127.0.0.52 127.0.0.53)
NODES=(alpha beta gamma)

log() { printf '[resync-load] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
for t in fio nbdcopy python3; do command -v $t >/dev/null || die "$t is needed (apt-get install fio libnbd-bin python3)"; done
[[ -x $TANDEM_BIN ]] || die "no tandem binary at $TANDEM_BIN (cargo build --release -p tandem-cli)"
[[ $IMAGE_MB =~ ^[0-9]+$ ]] || die "IMAGE_MB must be a number of MiB"
if [[ $LINK == tbf ]]; then
  for t in ip tc; do command -v $t >/dev/null || die "$t is needed for LINK=tbf (apt-get install iproute2)"; done
  [[ $(id -u) == 0 ]] || die "LINK=tbf needs root (network namespaces)"
fi

WORK=$(mktemp -d /tmp/resync-load.XXXXXX)
PIDS=()
stop_all() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
NS=rl$$
NETNS=()
# One namespace per node cabled (veth) to a bridge in a hub namespace; beta's cable
# is p1 on the hub's side.
make_lab() {
  local i ns
  NETNS=("$NS-hub" "$NS-alpha" "$NS-beta" "$NS-gamma")
  for ns in "${NETNS[@]}"; do ip netns add "$ns"; ip -n "$ns" link set lo up; done
  ip -n "$NS-hub" link add br0 type bridge
  ip -n "$NS-hub" link set br0 up
  for i in 0 1 2; do
    ns=$NS-${NODES[i]}
    ip -n "$NS-hub" link add "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$NS-hub" link set "p$i" master br0
    ip -n "$NS-hub" link set "p$i" up
    ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
}
drop_lab() {
  local ns
  for ns in "${NETNS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  NETNS=()
}
if [[ $LINK == tbf ]]; then IPS=(10.77.0.1 10.77.0.2 10.77.0.3); fi
trap 'stop_all; drop_lab; rm -rf -- "$WORK"' EXIT

status() { "$TANDEM_BIN" status --json --control "$WORK/$1.ctl" 2>/dev/null; }
disk_of() { status "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["volumes"][0]["disk"])' 2>/dev/null || echo none; }
wait_disk() { # node state seconds
  local i
  for ((i = 0; i < $3 * 20; i++)); do [[ $(disk_of "$1") == "$2" ]] && return 0; sleep 0.05; done
  die "$1 not $2 within $3 s"
}

start_node() {
  local in=()
  [[ $LINK == tbf ]] && in=(ip netns exec "$NS-$1")
  "${in[@]}" "$TANDEM_BIN" node --name "$1" --config-dir "$WORK/conf" --control "$WORK/$1.ctl" >>"$WORK/$1.log" 2>&1 &
  PIDS+=($!)
}

# fio_lat SECONDS OUT [DEPTH [RATE_IOPS]] — 4k random writes through gamma (iodepth 1
# unless told, at most RATE_IOPS if given); prints "mean_us p99_us iops"
fio_lat() {
  local rate=()
  [[ -n ${4:-} ]] && rate=(--rate_iops="$4")
  fio --name=lat --ioengine=nbd --uri="nbd+unix:///?socket=$WORK/gamma.sock" --rw=randwrite \
    --bs=4k --iodepth="${3:-1}" "${rate[@]}" --time_based --runtime="$1" --norandommap --randrepeat=0 \
    --size="${IMAGE_MB}M" --output-format=json --output="$2" >/dev/null || true # SIGINT ends it
  python3 - "$2" <<'PY'
import json, sys
t = open(sys.argv[1]).read(); j = json.loads(t[t.find("{"):])
w = j["jobs"][0]["write"]; c = w["clat_ns"]
print(f'{c["mean"]/1000:.1f} {c["percentile"]["99.000000"]/1000:.1f} {w["iops"]:.0f}')
PY
}

ROWS=()
for variant in $VARIANTS; do
  case $variant in
    paced) netcfg='resync-min-rate = "32M"' ;;
    unpaced) netcfg='resync-min-rate = "0"' ;;
    min1m) netcfg='resync-min-rate = "1M"' ;;
    ctl) netcfg=$'resync-min-rate = "1M"\nresync-delay-target = "100ms"' ;;
    fixed) netcfg=$'resync-min-rate = "1M"\nresync-plan-ahead = "0s"' ;;
    *) die "unknown variant $variant (paced, unpaced, min1m, ctl, fixed)" ;;
  esac
  [[ $LINK == tbf ]] && { drop_lab; make_lab; }
  rm -rf "${WORK:?}"/* && mkdir -p "$WORK/conf"
  {
    printf '[resource]\nname = "r0"\nprotocol = "C"\nshared-secret = "resync-load-%s"\n\n[net]\n%s\n\n' "$$" "$netcfg"
    printf '[[volume]]\nnumber = 0\nsize = "%sM"\n' "$IMAGE_MB"
    for i in 0 1 2; do
      printf '\n[[node]]\nname = "%s"\nnode-id = %d\naddress = "%s:%d"\n  [[node.volume]]\n  number = 0\n' \
        "${NODES[i]}" "$i" "${IPS[i]}" "$PORT"
      if ((i == 2)); then printf '  disk = "none"\n  nbd = ["unix:%s/gamma.sock"]\n' "$WORK"
      else printf '  disk = "%s/%s.img"\n  nbd = []\n' "$WORK" "${NODES[i]}"; fi
    done
  } >"$WORK/conf/r0.toml"
  for n in "${NODES[@]}"; do start_node "$n"; done
  wait_disk alpha UpToDate 30
  wait_disk beta UpToDate 30
  "$TANDEM_BIN" primary r0 --control "$WORK/gamma.ctl" >/dev/null
  log "$variant: prefilling ${IMAGE_MB} MiB through gamma"
  dd if=/dev/urandom of="$WORK/src.img" bs=1M count="$IMAGE_MB" status=none
  nbdcopy --flush "$WORK/src.img" "nbd+unix:///?socket=$WORK/gamma.sock"
  rm -f "$WORK/src.img"
  sleep 1
  if [[ $LINK == tbf ]]; then
    tc -n "$NS-hub" qdisc add dev p1 root tbf rate "$LINK_RATE" burst 32kbit latency 400ms
    log "$variant: what reaches beta limited to $LINK_RATE"
  fi
  depth=1 half=""
  if [[ $LOAD == half ]]; then
    depth=16
    read -r _ _ max_iops < <(fio_lat "$RUNTIME" "$WORK/max.json" "$depth")
    half=$((max_iops / 2))
    log "$variant: unloaded ${max_iops} IOPS at iodepth $depth; the load is $half IOPS"
  fi
  read -r idle_mean idle_p99 idle_iops < <(fio_lat "$RUNTIME" "$WORK/idle.json" "$depth" "$half")
  log "$variant: idle: mean ${idle_mean} us, p99 ${idle_p99} us"
  # Beta thrown away: its next start is synced in full from alpha, under the writes.
  kill -TERM "${PIDS[1]}"; wait "${PIDS[1]}" || true
  "$TANDEM_BIN" invalidate r0 --name beta --config-dir "$WORK/conf" >/dev/null
  # The writes run first: a resync that starts before the first write reaches beta
  # is not held until one does (with these fast loopback links, 512 MiB were pulled
  # in that first half second when fio started together with beta). They are
  # stopped (SIGINT: fio still reports) when beta is UpToDate, so the latencies are
  # those during the resync.
  fio_lat 3600 "$WORK/sync.json" "$depth" "$half" >"$WORK/sync.txt" &
  fio_pid=$!
  sleep 1
  t0=$(date +%s.%N)
  start_node beta
  wait_disk beta UpToDate 900
  t1=$(date +%s.%N)
  pkill -INT -P "$fio_pid" fio 2>/dev/null || true
  wait "$fio_pid" || true
  read -r sync_mean sync_p99 sync_iops <"$WORK/sync.txt"
  took=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
  log "$variant: during the resync: mean ${sync_mean} us, p99 ${sync_p99} us; resync ${took} s"
  ROWS+=("| $variant | ${netcfg//$'\n'/, } | ${LOAD}${half:+ (${half} IOPS of ${max_iops})} | $idle_iops | $idle_mean | $idle_p99 | $sync_iops | $sync_mean | $sync_p99 | $(python3 -c "print(f'{$sync_mean / $idle_mean:.2f}x')") | $took s ($(python3 -c "print(f'{$IMAGE_MB / ($t1 - $t0):.0f}')") MiB/s) |")
  cp "$WORK/beta.log" "${TMPDIR:-/tmp}/resync-load-beta-$variant.log"
  stop_all
done

stamp=$(date +%Y%m%d-%H%M%S)
mkdir -p "$RESULTS_DIR"
out=$RESULTS_DIR/resync-load-$stamp.md
{
  echo "# Foreground writes during a full resync — $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo
  echo "Command (cwd \`$REPO\`): \`$([[ $LINK == tbf ]] && echo "LINK=tbf LINK_RATE=$LINK_RATE ")IMAGE_MB=$IMAGE_MB RUNTIME=$RUNTIME VARIANTS=\"$VARIANTS\" LOAD=$LOAD TANDEM_BIN=$TANDEM_BIN bench/resync-load.sh\`"
  echo
  echo "tandem $("$TANDEM_BIN" --version 2>&1 | head -1), repo $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?'); $(nproc) CPUs; volume ${IMAGE_MB} MiB prefilled with random data; alpha and beta diskful, gamma diskless Primary (protocol C)$([[ $LINK == tbf ]] && echo ", each in its own network namespace, what reaches beta limited to $LINK_RATE (tbf burst 32kbit latency 400ms)"); fio 4k randwrite through gamma (load: qd1 = iodepth 1; half = iodepth 16 held to half the unloaded IOPS) for ${RUNTIME} s idle, then from 1 s before beta's restart after \`tandem invalidate\` (a full resync from alpha) until beta is UpToDate."
  echo
  echo "| variant | [net] | load | idle IOPS | idle mean µs | idle p99 µs | during IOPS | during mean µs | during p99 µs | mean during / idle | resync took |"
  echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"
  printf '%s\n' "${ROWS[@]}"
} | tee "$out"
log "results written to $out"
