#!/usr/bin/env bash
# rounds.sh — run a benchmark script several times and summarise its targets.
#
# On this project's VM one server's throughput moves by up to 40 % between runs a
# minute apart (nbdkit's 4k randwrite QD16×2: 63k–110k IOPS), so one run's ratio says
# little about a target near it. This runs the same script ROUNDS times (each run still
# interleaves the servers job by job) and reports every round's ratio per target, the
# median and the spread; a target counts as met when the median meets it.
#
# Usage: [ROUNDS=3] bench/rounds.sh [bench/replicated.sh|bench/nbd-peers.sh]
# Every other variable (JOBS, SERVERS, RUNTIME, WAIT_IDLE, ...) goes to the script as is.
# Writes bench/results/<script>-rounds-<date>.md (RESULTS_DIR overrides the directory).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
BENCH=${1:-$SCRIPT_DIR/replicated.sh}
ROUNDS=${ROUNDS:-3}
RESULTS_DIR=${RESULTS_DIR:-$REPO/bench/results}
[[ -x $BENCH ]] || { echo "rounds.sh: $BENCH is not an executable benchmark script" >&2; exit 2; }
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "rounds.sh: ROUNDS must be a positive integer" >&2; exit 2; }

reports=()
for ((i = 1; i <= ROUNDS; i++)); do
  echo "[rounds] round $i of $ROUNDS: $BENCH" >&2
  log=$(mktemp)
  if ! "$BENCH" 2>&1 | tee "$log" >&2; then
    echo "rounds.sh: round $i failed (log: $log)" >&2
    exit 1
  fi
  report=$(sed -n 's/.*results written to \(.*\.md\)$/\1/p' "$log" | tail -n 1)
  rm -f "$log"
  [[ -f $report ]] || { echo "rounds.sh: round $i wrote no report" >&2; exit 1; }
  reports+=("$report")
done

name=$(basename "$BENCH" .sh)
mkdir -p "$RESULTS_DIR"
out="$RESULTS_DIR/$name-rounds-$(date -u +%Y%m%d-%H%M%S).md"
python3 - "$out" "$ROUNDS" "$BENCH" "${reports[@]}" <<'PY'
import re, statistics, sys
out, rounds, bench, reports = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
# The target rows of fio_report.py: | what op N× | tandem | peer | ratio× | met? |
row = re.compile(r"^\| (.+? (?:≥|≤) [\d.]+×) \| [^|]+ \| [^|]+ \| ([\d.]+)× \| [^|]+ \|$")
targets = {}
for r in reports:
    for line in open(r, encoding="utf-8"):
        m = row.match(line.rstrip("\n"))
        if m:
            targets.setdefault(m.group(1), []).append(float(m.group(2)))
lines = [
    f"# {bench.split('/')[-1]}: {rounds} rounds",
    "",
    "Each round is one full run of the script (servers interleaved job by job); the",
    "reports: " + ", ".join(f"`{r.split('/')[-1]}`" for r in reports) + ".",
    "",
    "| target | " + " | ".join(f"round {i + 1}" for i in range(rounds))
    + " | median | min–max | met by the median? |",
    "|---|" + "---:|" * rounds + "---:|---|---|",
]
for t, ratios in targets.items():
    goal = float(re.search(r"([\d.]+)×$", t).group(1))
    med = statistics.median(ratios)
    met = med >= goal if "≥" in t else med <= goal
    cells = " | ".join(f"{x:.2f}×" for x in ratios)
    lines.append(f"| {t} | {cells} | {med:.2f}× | {min(ratios):.2f}–{max(ratios):.2f}× | "
                 + ("yes" if met else "**no**") + " |")
if not targets:
    lines.append("(the reports list no targets)")
open(out, "w", encoding="utf-8").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "[rounds] summary written to $out" >&2
