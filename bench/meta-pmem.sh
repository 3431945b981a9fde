#!/usr/bin/env bash
# meta-pmem.sh — what metadata writes cost on the write path, and what metadata on
# persistent memory saves (issue 14, item 5): fio (ioengine=nbd, over a Unix
# socket) against, in one run and interleaved job by job, three replicated
# volumes that differ only in where their metadata goes:
#
#   md-disk   meta-disk = "internal": the activity log and bitmaps at the end
#             of the backing file, on the same disk as the data
#   md-pmem   meta-disk = "pmem:/dev/shm/.../NODE.md": a memory-mapped file;
#             an activity-log transaction is stores, cache-line write-backs
#             and a fence. There is no NVDIMM here: a file on /dev/shm (tmpfs)
#             stands in for one. That emulates pmem's latency, not its
#             durability (tmpfs is lost on power loss).
#   md-off    like md-disk, with every node started with
#             --unsafe-no-activity-log: no activity-log transactions, no
#             metadata state writes while running. The ceiling.
#
# Each variant is a resource r0 of two diskful nodes, alpha and beta (protocol
# C), with `al-extents` small against a large sparse volume (default 64
# extents = 256 MiB of 16 GiB), so 4k random writes almost always miss the
# activity log; alpha is Primary and serves NBD, fio talks to alpha.
#
# This is a benchmark, not a test: it never fails on "slow" numbers.
# See bench/README.md for how to run it and what the columns mean.
#
# Environment:
#   VARIANTS     variants to run, in order (default "md-disk md-pmem md-off")
#   JOBS         subset of randwrite1 randwrite16 randwrite16x2 (default: all)
#   IMAGE_GB     volume size in GiB (default 16); IMAGE_MB, if set, wins
#   AL_EXTENTS   al-extents of every node volume (default 64: 4 MiB each)
#   RUNTIME      measured seconds per job (default 15)
#   RAMP         fio ramp_time seconds per job (default 3)
#   TANDEM_BIN   tandem binary (default <repo>/target/release/tandem; built
#                with `cargo build --release -p tandem-cli` if missing)
#   TANDEM_BUILD =1 to always run the cargo build first
#   TANDEM_PROTOCOL  replication protocol A/B/C (default C)
#   TANDEM_IPS   six addresses: alpha and beta of md-disk, md-pmem, md-off
#                (default "127.0.0.41 ... 127.0.0.46")
#   TANDEM_PORT  their replication port (default 7791)
#   TANDEM_ARGS  extra `tandem node` arguments (every daemon)
#   WORKDIR      where backing files, sockets, logs go (default: mktemp -d /tmp)
#   PMEM_DIR     where the md-pmem metadata files go (default: mktemp -d
#                /dev/shm/tandem-meta-pmem.XXXXXX)
#   KEEP_WORKDIR =1 to keep WORKDIR and PMEM_DIR (backing files, fio JSON, logs)
#   RESULTS_DIR  where the .md goes (default <repo>/bench/results)
#   WAIT_IDLE, IDLE_PCT  as in replicated.sh
#   TARGETS      goals printed next to the ratios (fio_report.py --targets;
#                base md-pmem)
#   CHECK_REPLICAS   1 (default): compare alpha's and beta's data after every
#                job; 0: only at the end
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
BENCH_TAG=meta-pmem
# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"
ORIG_CMD="$0${*:+ $*}"
bench_user_env VARIANTS JOBS RUNTIME RAMP IMAGE_GB IMAGE_MB AL_EXTENTS WORKDIR PMEM_DIR \
  KEEP_WORKDIR RESULTS_DIR WAIT_IDLE IDLE_PCT TANDEM_BIN TANDEM_BUILD TANDEM_PROTOCOL \
  TANDEM_IPS TANDEM_PORT TANDEM_ARGS TARGETS CHECK_REPLICAS

# This benchmark's jobs (replacing lib.sh's list): 4k random writes only.
JOB_LIST=(randwrite1 randwrite16 randwrite16x2)
JOB_ARGS=(
  [randwrite1]="--rw=randwrite --bs=4k --iodepth=1 --numjobs=1"
  [randwrite16]="--rw=randwrite --bs=4k --iodepth=16 --numjobs=1"
  [randwrite16x2]="--rw=randwrite --bs=4k --iodepth=16 --numjobs=2"
)

IMAGE_GB=${IMAGE_GB:-16}
[[ $IMAGE_GB =~ ^[0-9]+$ && $IMAGE_GB -ge 1 ]] || die "IMAGE_GB must be an integer >= 1"
IMAGE_MB=${IMAGE_MB:-$((IMAGE_GB * 1024))}
bench_common_env
VARIANTS=${VARIANTS:-md-disk md-pmem md-off}
AL_EXTENTS=${AL_EXTENTS:-64}
TANDEM_PROTOCOL=${TANDEM_PROTOCOL:-C}
TANDEM_IPS=${TANDEM_IPS:-127.0.0.41 127.0.0.42 127.0.0.43 127.0.0.44 127.0.0.45 127.0.0.46}
TANDEM_PORT=${TANDEM_PORT:-7791}
CHECK_REPLICAS=${CHECK_REPLICAS:-1}
# The issue's targets: md-pmem / md-off.
TARGETS=${TARGETS:-randwrite1 iops md-off >= 0.9; randwrite16 iops md-off >= 0.9}

NODES=(alpha beta) # both diskful; alpha is Primary and serves NBD
ALL_VARIANTS=(md-disk md-pmem md-off)

[[ $AL_EXTENTS =~ ^[0-9]+$ && $AL_EXTENTS -ge 7 && $AL_EXTENTS -le 65534 ]] ||
  die "AL_EXTENTS must be an integer in 7..=65534 (got '$AL_EXTENTS')"
[[ $TANDEM_PROTOCOL =~ ^[ABC]$ ]] || die "TANDEM_PROTOCOL must be A, B or C"
[[ $TANDEM_PORT =~ ^[0-9]+$ ]] || die "TANDEM_PORT must be a port number"
read -ra IPS <<<"$TANDEM_IPS"
((${#IPS[@]} == 6)) || die "TANDEM_IPS must list six addresses (alpha, beta of md-disk, md-pmem, md-off)"
declare -A IP_OF # VARIANT.NODE -> address (fixed per variant, whatever VARIANTS runs)
for i in 0 1 2; do
  IP_OF[${ALL_VARIANTS[i]}.alpha]=${IPS[2 * i]}
  IP_OF[${ALL_VARIANTS[i]}.beta]=${IPS[2 * i + 1]}
done

# ---------------------------------------------------------------- checks
bench_need fio fio python3 python3 nbdinfo libnbd-bin truncate coreutils findmnt util-linux
fio --enghelp=nbd >/dev/null 2>&1 || die "this fio has no nbd ioengine"
bench_tandem_bin || die "tandem binary '$TANDEM_BIN' not found/not executable and could not be built"

RUN=()
for v in $VARIANTS; do
  case $v in
    md-disk | md-pmem) ;;
    md-off)
      "$TANDEM_BIN" node --help 2>/dev/null | grep -q -- --unsafe-no-activity-log ||
        die "md-off needs \`tandem node --unsafe-no-activity-log\`, which $TANDEM_BIN does not have (build a newer tandem, or leave md-off out: VARIANTS=\"md-disk md-pmem\")"
      ;;
    *) die "unknown variant '$v' (known: ${ALL_VARIANTS[*]})" ;;
  esac
  [[ " ${RUN[*]} " != *" $v "* ]] || die "variant '$v' named twice"
  RUN+=("$v")
done
((${#RUN[@]} > 0)) || die "no variants to benchmark"
has_variant() { [[ " ${RUN[*]} " == *" $1 "* ]]; }

# ---------------------------------------------------------------- workdir
# The backing files are sparse: they use only what the writes touch. Check for
# min(IMAGE, what 40k 4k writes/s write over every job's ramp + runtime) per
# replica (the fastest variant's rate on a 2-core machine).
per_replica=$((160 * (RUNTIME + RAMP) * ${#JOB_LIST[@]}))
((per_replica < IMAGE_MB)) || per_replica=$IMAGE_MB
bench_workdir meta-pmem $((${#RUN[@]} * 2 * per_replica))
SIZE=$((IMAGE_MB * 1048576))

OWN_PMEM=0
if has_variant md-pmem; then
  if [[ -n ${PMEM_DIR:-} ]]; then
    mkdir -p "$PMEM_DIR"
    PMEM_DIR=$(cd "$PMEM_DIR" && pwd)
  else
    [[ -d /dev/shm && -w /dev/shm ]] || die "no writable /dev/shm for the emulated pmem (set PMEM_DIR)"
    PMEM_DIR=$(mktemp -d /dev/shm/tandem-meta-pmem.XXXXXX)
    OWN_PMEM=1
  fi
  # (the last line: the mount on top when several are stacked there)
  PMEM_FS=$(findmnt -no FSTYPE -T "$PMEM_DIR" 2>/dev/null | tail -n 1)
  PMEM_OPTS=$(findmnt -no OPTIONS -T "$PMEM_DIR" 2>/dev/null | tail -n 1)
fi

declare -A URI PIDS LABELS SRV_CMDS VDIR REPLICA_DIFF STATE_END MD_DESC
CHECKS=()  # when the replicas were compared: write jobs, "stop"
CREATED=() # files and directories made in a WORKDIR / PMEM_DIR that is not ours

cleanup() {
  bench_stop_all
  bench_remove_workdir || { [[ -z ${PMEM_DIR:-} ]] || log "kept pmem dir $PMEM_DIR"; return; }
  local f
  if [[ $OWN_PMEM == 1 ]]; then
    rm -rf -- "$PMEM_DIR"
  elif [[ -n ${PMEM_DIR:-} ]]; then
    for f in "${CREATED[@]}"; do rm -rf -- "$f"; done
  fi
}
bench_traps

# vstate VARIANT — print one line per node (role, disk, peers); exit 0 when
# both nodes are UpToDate, the peer link Connected/Established, nothing out
# of sync.
vstate() {
  python3 "$SCRIPT_DIR/node_state.py" "$TANDEM_BIN" "${VDIR[$1]}" "${NODES[@]}"
}

# wait_nbd VARIANT SOCK — until the export at SOCK answers with the right size.
wait_nbd() { bench_wait_nbd "$1" "$2" "$SIZE"; }

# meta_disk_of VARIANT NODE — the node volume's meta-disk value.
meta_disk_of() {
  case $1 in
    md-pmem) echo "pmem:$PMEM_DIR/$1.$2.md" ;;
    *) echo internal ;;
  esac
}

# start_variant VARIANT — write its resource file, start alpha and beta,
# wait until both are UpToDate and connected, make alpha Primary.
start_variant() {
  local v=$1 d=$WORKDIR/$1 n i ip port_busy="" md
  local conf=$d/conf/r0.toml
  VDIR[$v]=$d
  if command -v ss >/dev/null; then
    for n in "${NODES[@]}"; do
      ip=${IP_OF[$v.$n]}
      if ss -Hltn "src $ip:$TANDEM_PORT" 2>/dev/null | grep -q .; then port_busy+=" $ip:$TANDEM_PORT"; fi
    done
    [[ -z $port_busy ]] || die "already in use:$port_busy (another tandem? set TANDEM_IPS / TANDEM_PORT)"
  fi
  mkdir -p "$d/conf"
  CREATED+=("$d")
  rm -f -- "$d"/*.img "$d"/*.ctl "$d"/*.sock
  for n in "${NODES[@]}"; do
    md=$(meta_disk_of "$v" "$n")
    if [[ $md == pmem:* ]]; then
      # fresh metadata: the daemon creates the file (sized for the volume)
      rm -f -- "${md#pmem:}"
      CREATED+=("${md#pmem:}")
    fi
  done
  {
    echo "# Written by bench/meta-pmem.sh (variant $v): the same file for both nodes."
    echo "[resource]"
    echo "name = \"r0\""
    echo "protocol = \"$TANDEM_PROTOCOL\""
    echo "shared-secret = \"bench-meta-pmem-$v-$$\""
    echo
    echo "[[volume]]"
    echo "number = 0"
    echo "size = \"${IMAGE_MB}M\""
    for i in 0 1; do
      n=${NODES[i]}
      echo
      echo "[[node]]"
      echo "name = \"$n\""
      echo "node-id = $i"
      echo "address = \"${IP_OF[$v.$n]}:$TANDEM_PORT\""
      echo "  [[node.volume]]"
      echo "  number = 0"
      echo "  disk = \"$d/$n.img\""
      echo "  meta-disk = \"$(meta_disk_of "$v" "$n")\""
      echo "  al-extents = $AL_EXTENTS"
      if [[ $n == alpha ]]; then
        echo "  nbd = [\"unix:$d/$n.sock\"]"
      else
        echo "  nbd = []"
      fi
    done
  } >"$conf"
  local -a cmd extra=()
  [[ $v == md-off ]] && extra=(--unsafe-no-activity-log)
  local pids="" labels=""
  for n in "${NODES[@]}"; do
    # shellcheck disable=SC2206  # TANDEM_ARGS is deliberately word-split
    cmd=("$TANDEM_BIN" node --name "$n" --config-dir "$d/conf" --control "$d/$n.ctl" "${extra[@]}" ${TANDEM_ARGS:-})
    add_cmd "$v" "${cmd[@]}"
    bench_spawn "$v.$n" "$WORKDIR/logs/$v.$n.log" "${cmd[@]}"
    pids+=${pids:+,}${PIDOF[$v.$n]}
    labels+=${labels:+,}$n
  done
  PIDS[$v]=$pids
  LABELS[$v]=$labels
  local state=""
  for ((i = 0; i < 300; i++)); do
    bench_alive "$pids" || { tail -n 30 "$WORKDIR/logs/$v".*.log >&2 || true; die "$v: a node exited during startup"; }
    if state=$(vstate "$v" 2>&1); then break; fi
    sleep 0.1
  done
  ((i < 300)) || { echo "$state" >&2; die "$v: nodes not connected and UpToDate within 30 s"; }
  log "$v nodes connected: $(echo "$state" | tr '\n' ' ')"
  "$TANDEM_BIN" primary r0 --control "$d/alpha.ctl" >&2 || die "$v: tandem primary r0 on alpha failed"
  add_cmd "$v" "$TANDEM_BIN" primary r0 --control "$d/alpha.ctl"
  URI[$v]="nbd+unix:///?socket=$d/alpha.sock"
  wait_nbd "$v" "$d/alpha.sock"
  log "$v ready (pids $pids: ${labels//,/ }; fio on alpha)"
}

# diffdata A B SIZE — compare the first SIZE bytes (the data area; internal
# metadata follows it) of two sparse replica files, reading only the ranges
# where either file has data (SEEK_DATA/SEEK_HOLE; holes read as zeroes, so a
# range that is a hole in both is equal). Prints "<differing 4 KiB blocks>
# <4 KiB blocks holding data in either file> <blocks in SIZE> <size A> <size B>".
diffdata() {
  python3 - "$@" <<'PY'
import os, sys
a, b, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
BS, CHUNK = 4096, 1 << 20

def data_ranges(fd):
    out, off = [], 0
    while off < size:
        try:
            s = os.lseek(fd, off, os.SEEK_DATA)
        except OSError as e:
            if e.errno == 6:  # ENXIO: no data after off
                break
            return [(0, size)]  # no SEEK_DATA here: compare everything
        if s >= size:
            break
        e = min(os.lseek(fd, s, os.SEEK_HOLE), size)
        out.append((s, e))
        off = e
    return out

fa, fb = os.open(a, os.O_RDONLY), os.open(b, os.O_RDONLY)
ranges = sorted((s // BS * BS, min(-(-e // BS) * BS, size))
                for s, e in data_ranges(fa) + data_ranges(fb))
merged = []
for s, e in ranges:
    if merged and s <= merged[-1][1]:
        merged[-1][1] = max(merged[-1][1], e)
    else:
        merged.append([s, e])
diff = blocks = 0
for s, e in merged:
    off = s
    while off < e:
        n = min(CHUNK, e - off)
        x, y = os.pread(fa, n, off), os.pread(fb, n, off)
        x, y = x.ljust(n, b"\0"), y.ljust(n, b"\0")  # a short file reads as zeroes
        blocks += -(-n // BS)
        if x != y:
            diff += sum(1 for o in range(0, n, BS) if x[o:o + BS] != y[o:o + BS])
        off += n
print(diff, blocks, size // BS, os.fstat(fa).st_size, os.fstat(fb).st_size)
PY
}

# compare_replicas WHEN — alpha's and beta's data of every variant. Between
# jobs nothing is in flight, so they must be identical.
declare -A REPLICA_DATA
compare_replicas() {
  local when=$1 v nd nb nt sa sb
  CHECKS+=("$when")
  for v in "${RUN[@]}"; do
    [[ -z ${DEAD[$v]:-} ]] || continue
    read -r nd nb nt sa sb < <(diffdata "${VDIR[$v]}/alpha.img" "${VDIR[$v]}/beta.img" "$SIZE")
    REPLICA_DIFF[$v.$when]=$nd
    REPLICA_DATA[$v]="$nb of $nt blocks hold data; file sizes $sa, $sb bytes"
    ((nd == 0)) || log "WARNING: $v: $nd of $nb written 4 KiB blocks differ between alpha's and beta's data ($when)"
  done
}

# md_dump VARIANT NODE desc|seq — read the replica's metadata with `tandem
# dump-md` (read-only; between jobs nothing is in flight, and the reads go
# through the page cache the daemon writes to). seq: the activity log's newest
# transaction number ("?" if unreadable); desc: placement, geometry, flags.
MD_DUMP_PY=$(cat <<'PY'
import json, sys
try:
    d = json.load(sys.stdin)
except ValueError:
    print("?" if sys.argv[1] == "seq" else "dump-md failed")
    sys.exit()
al, lay = d.get("activity_log") or {}, d.get("layout") or {}
seq = al.get("newest_seq")
if sys.argv[1] == "seq":
    print("?" if seq is None else seq)
else:
    flags = ",".join((d.get("superblock") or {}).get("flags") or [])
    print(f"placement {lay.get('placement')}, metadata {lay.get('md_size')} bytes at offset "
          f"{lay.get('md_offset')}, al-extents {lay.get('al_extents')}; flags {flags}; "
          f"newest activity-log transaction {seq}")
PY
)
md_dump() {
  { "$TANDEM_BIN" dump-md r0 --name "$2" --config-dir "${VDIR[$1]}/conf" 2>/dev/null || true; } |
    python3 -c "$MD_DUMP_PY" "$3" 2>/dev/null || true
}

# al_sample WHEN — every node's activity-log sequence number, AL_SEQ[VARIANT.NODE.WHEN].
declare -A AL_SEQ
al_sample() {
  local v n
  for v in "${RUN[@]}"; do
    for n in "${NODES[@]}"; do AL_SEQ[$v.$n.$1]=$(md_dump "$v" "$n" seq); done
  done
}

# al_table — Markdown: activity-log transactions each node wrote per job, and
# per write (writes estimated as fio's IOPS x (runtime + ramp): the ramp's
# writes pass the log too).
al_table() {
  local job v prev=start a b iops
  echo "| job | variant | transactions alpha | transactions beta | ≈ per write alpha | ≈ per write beta |"
  echo "|---|---|---:|---:|---:|---:|"
  for job in "${JOB_LIST[@]}"; do
    for v in "${RUN[@]}"; do
      iops=$(python3 -c '
import sys
sys.path.insert(0, sys.argv[1])
import fio_report
try:
    print(fio_report.metrics(fio_report.load_fio_json(sys.argv[2]))["iops"])
except Exception:
    print(0)
' "$SCRIPT_DIR" "$WORKDIR/fio/$job.$v.json" 2>/dev/null || echo 0)
      a=$(al_delta "$v" alpha "$prev" "$job")
      b=$(al_delta "$v" beta "$prev" "$job")
      echo "| $job | $v | $a | $b | $(per_write "$a" "$iops") | $(per_write "$b" "$iops") |"
    done
    prev=$job
  done
}
al_delta() { # variant node from to
  local x=${AL_SEQ[$1.$2.$3]:-?} y=${AL_SEQ[$1.$2.$4]:-?}
  if [[ $x =~ ^[0-9]+$ && $y =~ ^[0-9]+$ ]]; then echo $((y - x)); else echo "n/a"; fi
}
per_write() { # transactions iops
  awk -v t="$1" -v i="$2" -v s=$((RUNTIME + RAMP)) \
    'BEGIN { if (t ~ /^[0-9]+$/ && i > 0) printf "%.2f", t / (i * s); else print "n/a" }'
}

# ---------------------------------------------------------------- prepare
bench_machine_start
log "workdir $WORKDIR${PMEM_DIR:+; pmem dir $PMEM_DIR ($PMEM_FS)}; variants: ${RUN[*]}; jobs: ${JOB_LIST[*]}; runtime ${RUNTIME}s + ramp ${RAMP}s; ${IMAGE_MB} MiB volume, al-extents $AL_EXTENTS"
for v in "${RUN[@]}"; do start_variant "$v"; done

RECORDS=$WORKDIR/fio/records.tsv
WINDOWS=$WORKDIR/fio/windows.tsv # "JOB on VARIANT" start end (epoch s)
: >"$RECORDS"
: >"$WINDOWS"
FIO_EXAMPLE="fio --name=JOB $FIO_COMMON <job args> --uri=$FIO_EXAMPLE_URI --output=FILE"

# ---------------------------------------------------------------- run
al_sample start
for job in "${JOB_LIST[@]}"; do
  for v in "${RUN[@]}"; do
    t0=$(now)
    bench_run_job "$job" "$v" "${URI[$v]}" "${PIDS[$v]}" "${LABELS[$v]}"
    printf '%s\t%s\t%s\n' "$job on $v" "$t0" "$(now)" >>"$WINDOWS"
  done
  t0=$(now)
  al_sample "$job"
  if [[ $CHECK_REPLICAS == 1 ]]; then compare_replicas "$job"; fi
  printf '%s\t%s\t%s\n' "the metadata reads and replica comparison after $job" "$t0" "$(now)" >>"$WINDOWS"
done

# State after the run (before stopping), then stop every daemon (not in the
# trap) to record how it exits on SIGTERM.
for v in "${RUN[@]}"; do
  [[ -z ${DEAD[$v]:-} ]] || { STATE_END[$v]="died during the run"; continue; }
  if STATE_END[$v]=$(vstate "$v" 2>&1); then
    STATE_END[$v]="both UpToDate, connected, nothing out of sync:"$'\n'"${STATE_END[$v]}"
  else
    STATE_END[$v]="NOT both connected/UpToDate/in sync:"$'\n'"${STATE_END[$v]}"
  fi
  log "$v at the end: $(echo "${STATE_END[$v]}" | tr '\n' ' ')"
done
declare -A EXIT_RC
for ((i = ${#STARTED[@]} - 1; i >= 0; i--)); do
  label=${STARTED[i]}
  [[ -n ${PIDOF[$label]:-} ]] || continue
  t0=$(now)
  bench_stop "$label"
  EXIT_RC[$label]=$STOP_RC
  printf '%s\t%s\t%s\n' "stopping $label" "$t0" "$(now)" >>"$WINDOWS"
done

# Are the replicas identical once everything is stopped (and flushed)?
DEAD=() # compare even a variant that died
compare_replicas stop

# What each replica's metadata says after the clean stop (dump-md: the
# placement and the activity log's geometry as the daemon saw them).
for v in "${RUN[@]}"; do
  for n in "${NODES[@]}"; do MD_DESC[$v.$n]=$(md_dump "$v" "$n" desc); done
done

# Warnings and errors in the daemons' logs: deduplicated per log file (count,
# the first time, and which job ran then: $WINDOWS has each fio run's span).
log_issues() {
  python3 - "$WINDOWS" "$WORKDIR" "${PMEM_DIR:-}" "$WORKDIR/logs"/md-*.log <<'PY'
import datetime, os, re, sys
windows, workdir, pmem, logs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
spans = []
with open(windows, encoding="utf-8") as f:
    for line in f:
        what, t0, t1 = line.rstrip("\n").split("\t")
        spans.append((float(t0), float(t1), what))
ansi = re.compile(r"\x1b\[[0-9;]*m")
head = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z?\s+(WARN|ERROR)\s+(.*)$")

def when(t):
    if not spans or t < spans[0][0]:
        return "start-up"
    for t0, t1, what in spans:
        if t0 <= t <= t1:
            return what if what.startswith("stopping") else "during " + what
    return "after the daemons stopped" if t > spans[-1][1] else "between the steps above"

for path in logs:
    seen = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = head.match(ansi.sub("", line.rstrip("\n")))
            if not m:
                continue
            msg = f"{m.group(2)} {m.group(3)}".replace(workdir, "$WORKDIR")
            if pmem:
                msg = msg.replace(pmem, "$PMEM_DIR")
            if msg not in seen:
                t = datetime.datetime.fromisoformat(m.group(1)).replace(
                    tzinfo=datetime.timezone.utc).timestamp()
                seen[msg] = [0, m.group(1)[11:23], when(t)]
            seen[msg][0] += 1
    for msg, (n, first, w) in seen.items():
        print(f"{os.path.basename(path)}: {n}× (first {first} UTC, {w}) {msg}")
PY
}

# ---------------------------------------------------------------- report
stamp=$(date +%Y%m%d-%H%M%S)
mkdir -p "$RESULTS_DIR"
md=$RESULTS_DIR/meta-pmem-$stamp.md
bench_git_rev
base_args=()
if has_variant md-pmem; then
  base_args=(--base md-pmem)
  has_variant md-off && base_args+=(--targets "$TARGETS")
fi
hot_mb=$((AL_EXTENTS * 4))

{
  echo "# Metadata on persistent memory — $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo
  echo "Command (cwd \`$PWD\`): \`$USER_ENV$ORIG_CMD\`"
  echo
  echo "| | |"
  echo "|---|---|"
  echo "| fio | $(fio --version) |"
  echo "| tandem | $(first_line "$TANDEM_BIN" --version), repo $GIT_REV |"
  bench_env_rows
  echo "| runtime | ${RUNTIME} s measured + ${RAMP} s ramp per job; no prefill (the backing files start empty and sparse) |"
  echo "| volume | ${IMAGE_MB} MiB, sparse backing files created by the daemons; al-extents $AL_EXTENTS × 4 MiB = $hot_mb MiB hot area, $(awk -v a="$hot_mb" -v b="$IMAGE_MB" 'BEGIN { printf "%.2f", 100 * a / b }') % of the volume: a uniform 4k random write finds its extent in the activity log about that often |"
  echo "| replication | protocol $TANDEM_PROTOCOL; per variant two diskful nodes, alpha (Primary, serves NBD, fio talks to it) and beta, port $TANDEM_PORT |"
  for v in "${RUN[@]}"; do
    case $v in
      md-disk) echo "| md-disk | meta-disk = \"internal\" (metadata at the end of each backing file, same disk as the data: $(findmnt -no FSTYPE -T "$WORKDIR" 2>/dev/null || echo '?')); ${IP_OF[md-disk.alpha]}, ${IP_OF[md-disk.beta]} |" ;;
      md-pmem) echo "| md-pmem | meta-disk = \"pmem:\$PMEM_DIR/md-pmem.NODE.md\", PMEM_DIR = $PMEM_DIR ($PMEM_FS, $PMEM_OPTS): memory-mapped, updates are stores + cache-line write-back + fence. **No NVDIMM: a file on $PMEM_FS stands in for pmem; this emulates pmem's latency, not its durability** (the daemon maps non-DAX files without MAP_SYNC and its sync is only a fence, so nothing survives a power loss); ${IP_OF[md-pmem.alpha]}, ${IP_OF[md-pmem.beta]} |" ;;
      md-off) echo "| md-off | meta-disk = \"internal\", nodes started with \`--unsafe-no-activity-log\` (no activity-log transactions or metadata state writes while running): the ceiling; ${IP_OF[md-off.alpha]}, ${IP_OF[md-off.beta]} |" ;;
    esac
  done
  echo
  echo "Variants (each its own resource, backing files, metadata and Unix socket; all kept running, jobs interleaved):"
  echo
  for v in "${RUN[@]}"; do
    echo "- **$v**:"
    while IFS= read -r c; do
      [[ -n $c ]] || continue
      c=${c//$WORKDIR/\$WORKDIR}
      [[ -z ${PMEM_DIR:-} ]] || c=${c//$PMEM_DIR/\$PMEM_DIR}
      echo "  - \`$c\`"
    done <<<"${SRV_CMDS[$v]}"
  done
  echo
  exits=""
  for label in "${STARTED[@]}"; do exits+="${exits:+, }$label ${EXIT_RC[$label]:-?}"; done
  echo "Exit status on SIGTERM: $exits."
  echo
  first=${RUN[0]}
  echo "Resource file of $first (\`\$WORKDIR/$first/conf/r0.toml\`; the other variants differ only in addresses, secret, paths and meta-disk):"
  echo
  echo '```toml'
  sed "s|$WORKDIR|\$WORKDIR|g${PMEM_DIR:+; s|$PMEM_DIR|\$PMEM_DIR|g}" "${VDIR[$first]}/conf/r0.toml"
  echo '```'
  echo
  echo "Metadata after the clean stop (\`tandem dump-md\`):"
  echo
  for v in "${RUN[@]}"; do
    for n in "${NODES[@]}"; do
      echo "- $v $n: meta-disk \`$(meta_disk_of "$v" "$n" | sed "s|${PMEM_DIR:-/nonexistent}|\$PMEM_DIR|")\`; ${MD_DESC[$v.$n]:-n/a}"
    done
  done
  echo
  echo "fio: \`$FIO_EXAMPLE\`, job args:"
  echo
  for j in "${JOB_LIST[@]}"; do echo "- $j: \`${JOB_ARGS[$j]}\`"; done
  echo
  python3 "$REPORT_PY" report "$RECORDS" "${base_args[@]}"
  echo "Latencies are fio completion latency (clat). Server CPU is utime+stime of both node"
  echo "daemons of a variant (alpha and beta, all threads) over fio's measured period, per"
  echo "completed write; server CPU % is of one core. Host busy % is the whole machine's non-idle"
  echo "CPU over the same window, out of $(nproc)00 % (daemons + fio + anything else running)."
  echo "The gap between md-disk and md-pmem is the point; md-off is the ceiling."
  echo
  echo "### Activity-log transactions"
  echo
  echo "How many activity-log transactions each node wrote during each job (the newest"
  echo "transaction number from \`tandem dump-md\`, read between jobs), and per write (writes"
  echo "estimated as IOPS × (runtime + ramp), the ramp's writes pass the log too). A write to an"
  echo "extent not in the log costs a transaction; beta's come from the replicated writes. With"
  echo "$AL_EXTENTS extents of 4 MiB over ${IMAGE_MB} MiB a random write should miss about"
  echo "$(awk -v a="$hot_mb" -v b="$IMAGE_MB" 'BEGIN { printf "%.0f", 100 - 100 * a / b }') % of the time."
  echo
  al_table
  echo
  echo "### Replica consistency"
  echo
  echo "Differing 4 KiB blocks between alpha's and beta's data (the first ${IMAGE_MB} MiB of each backing"
  echo "file; with internal metadata the metadata follows), compared between jobs (nothing in flight)"
  echo "and after the daemons stopped. Only the ranges where either file holds data are read"
  echo "(SEEK_DATA/SEEK_HOLE; both files read as zeroes elsewhere)."
  echo
  printf '| variant |'
  for c in "${CHECKS[@]}"; do printf ' after %s |' "$c"; done
  printf ' data at the end |\n|---|'
  for c in "${CHECKS[@]}"; do printf -- '---:|'; done
  printf -- '---|\n'
  for v in "${RUN[@]}"; do
    printf '| %s |' "$v"
    for c in "${CHECKS[@]}"; do printf ' %s |' "${REPLICA_DIFF[$v.$c]:-n/a}"; done
    printf ' %s |\n' "${REPLICA_DATA[$v]:-n/a}"
  done
  echo
  echo "Status at the end of the run (\`tandem status --json\`, before stopping):"
  echo
  echo '```'
  for v in "${RUN[@]}"; do
    echo "$v: ${STATE_END[$v]}"
  done
  echo '```'
  echo
  issues=$(log_issues 2>&1 || true)
  if [[ -n $issues ]]; then
    echo "Warnings and errors in the daemon logs (count × (first seen, during which job) message):"
    echo
    echo '```'
    head -n 60 <<<"$issues"
    echo '```'
  else
    echo "No warnings or errors in the daemon logs."
  fi
  echo
} | tee "$md"

log "results written to ${md}"
