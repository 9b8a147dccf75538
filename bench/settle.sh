#!/usr/bin/env bash
# bench/settle.sh — the compression ratio of `squeeze serve` after the harness's random-overwrite
# burst (W2), and how it recovers once the clients go idle (the merger rewrites fragmented LBA
# windows as whole blobs and the cleaner reclaims the garbage after 1 s of client silence).
# The shared harness (../shared/bench/run.sh) measures the ratio right after W2 only.
#
#   bench/settle.sh                                          # build release, one repetition (~2 min)
#   REPS=2 SETTLE_TIMES="0 5 10 20 30 60 120" bench/settle.sh
#   FIO_SIZE=256m FIO_RT_SEQ=10 FIO_RT_RAND=5 SETTLE_TIMES="0 5 10" bench/settle.sh   # smoke run
#
# Each repetition, on a fresh volume (`squeeze serve --socket S --size 64G $SQUEEZE_SERVE_ARGS
# DIR/vol.sqz`, the harness's custom peer), with the harness's job files and fio over NBD:
#   W1  w1-write: 128k sequential write of FIO_SIZE, QD128 (60% compressible per 4 KiB chunk);
#       then ratio(du) = W1's logical bytes (fio io_bytes) / `du -sB1 DIR`
#   W2  w2-randwrite: 4k random writes, QD32, FIO_RT_RAND s over W1's data
#   then no client I/O: at each of SETTLE_TIMES seconds after W2's fio exited (0 = at once, the
#   moment the harness's "ratio after W2" is taken) ratio(du), and from the control socket
#   (`squeeze stats --json DIR/vol.ctl`) the live compression_ratio, garbage_bytes, merged_bytes,
#   merge_bytes_written, stored_bytes, physical_bytes; plus the server's CPU seconds (utime+stime
#   of all its threads, /proc/PID/stat) and the machine's busy time since W2 ended.
# The whole run holds the bench lock (bench/README.md; the idle phase is a measurement too: the
# merger's CPU time and how fast it catches up). Needs fio (ioengine=nbd), flock, python3; not root.
#
# Env: REPS (1), FIO_SIZE (2g), FIO_RT_SEQ (30), FIO_RT_RAND (20), SETTLE_TIMES ("0 5 10 20 30 60"),
#      SQUEEZE_SERVE_ARGS (extra `serve` options), SCRATCH_BASE (/tmp: the volumes), OUT
#      (results/settle-<time>), BIN (a built squeeze; default: build it in CARGO_TARGET_DIR),
#      HARNESS (../shared/bench/run.sh: its job files are used), BENCH_LOCK (/tmp/bench.lock).
# Output: $OUT/settle.json (machine facts, settings, and per repetition W1 MB/s, W2 IOPS, the ratio
#      after W1 and one object per sample; bench/report.py reads it), OUT/results.jsonl (one line
#      per repetition and sample) and OUT/table.md, $OUT/machine.txt, raw fio JSON, stats JSON
#      and server logs under $OUT/raw/; a short summary on stdout, progress on stderr.
set -euo pipefail
shopt -s inherit_errexit

SQ_PROG=bench/settle.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REPS=${REPS:-1}
FIO_SIZE=${FIO_SIZE:-2g}
FIO_RT_SEQ=${FIO_RT_SEQ:-30}
FIO_RT_RAND=${FIO_RT_RAND:-20}
SETTLE_TIMES=${SETTLE_TIMES:-0 5 10 20 30 60}
SCRATCH_BASE=${SCRATCH_BASE:-/tmp}
JOBS=$(dirname "$HARNESS")
SERVE_ARGS=${SQUEEZE_SERVE_ARGS:-}

# settings
[[ $REPS =~ ^[1-9][0-9]*$ ]] || sq_die "REPS=$REPS is not a positive integer"
read -ra TIMES <<<"$SETTLE_TIMES"
((${#TIMES[@]})) || sq_die "SETTLE_TIMES is empty"
for t in "${TIMES[@]}"; do
  [[ $t =~ ^[0-9]+$ ]] || sq_die "SETTLE_TIMES: '$t' is not a whole number of seconds"
done
mapfile -t TIMES < <(printf '%s\n' "${TIMES[@]}" | sort -n -u)

# tools
missing=()
for t in fio flock python3 du getconf; do
  command -v "$t" >/dev/null 2>&1 || missing+=("$t")
done
((${#missing[@]} == 0)) || sq_die "missing ${missing[*]}; run: apt-get update && apt-get install -y fio util-linux python3 coreutils"
for wl in w1-write w2-randwrite; do
  [[ -r $JOBS/$wl.fio ]] || sq_die "no job file $JOBS/$wl.fio (set HARNESS)"
done
sq_lock
sq_bin

SCR=$(mktemp -d "$SCRATCH_BASE/squeeze-settle.XXXXXX")
SERVER_PID=0
HZ=$(getconf CLK_TCK)

cleanup() {
  sq_serve_stop srv
  rm -rf "$SCR"
}
sq_on_exit cleanup

sq_out settle "$SCRATCH_BASE"
mkdir -p "$OUT/raw"
{
  echo "settings: REPS=$REPS FIO_SIZE=$FIO_SIZE FIO_RT_SEQ=$FIO_RT_SEQ FIO_RT_RAND=$FIO_RT_RAND SETTLE_TIMES=${TIMES[*]}"
  echo "serve_args: $SERVE_ARGS"
  echo "fio: $(fio --version)"
} >>"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

proc_ticks() { # utime+stime of PID (all threads), in clock ticks
  local s
  s=$(cat "/proc/$1/stat") || sq_die "server $1 is gone"
  s=${s##*) }
  # shellcheck disable=SC2086 # split the fields
  set -- $s
  echo $((${12} + ${13}))
}
sys_busy() { # busy clock ticks of the whole machine (all cores) since boot
  local _c u n s _i _w q sq st
  read -r _c u n s _i _w q sq st _ </proc/stat
  echo $((u + n + s + q + sq + st))
}
now_us() { local t=${EPOCHREALTIME//[!0-9]/}; echo $((10#$t)); }
du_bytes() { du -sB1 "$1" | cut -f1; }
alive() {
  kill -0 "$SERVER_PID" 2>/dev/null || sq_die "the server exited: $(tail -n5 "$SERVER_LOG" 2>/dev/null)"
}

start_server() { # start_server DIR
  local dir=$1
  SOCK=$dir/nbd.sock CTL=$dir/data/vol.ctl SERVER_LOG=$OUT/raw/r$REP-serve.log
  mkdir -p "$dir/data"
  # shellcheck disable=SC2086 # SERVE_ARGS is a list of options
  sq_serve_start srv "$SERVER_LOG" --ready "$SOCK" --ready "$CTL" -- \
    --socket "$SOCK" --size 64G $SERVE_ARGS "$dir/data/vol.sqz"
  SERVER_PID=$(sq_serve_pid srv)
}

stop_server() {
  sq_serve_stop srv
  SERVER_PID=0
}

run_fio() { # run_fio WORKLOAD: fio on the job file of the harness, output in $OUT/raw/rREP-WL.json
  local wl=$1 rc=0 tag=$OUT/raw/r$REP-$1
  sq_log "rep $REP: $wl"
  fio --output-format=json "$JOBS/$wl.fio" >"$tag.json" 2>"$tag.err" || rc=$?
  ((rc == 0)) || sq_die "fio $wl failed (rc=$rc): $(tail -n3 "$tag.err")"
  alive
}

sample() { # sample TARGET_S: one line of $SAMPLES
  local target=$1 idle du cpu busy st=$OUT/raw/r$REP-stats-$1s.json
  idle=$(($(now_us) - W2_END_US))
  du=$(du_bytes "$DIR/data")
  "$BIN" stats --json "$CTL" >"$st" 2>"$st.err" || sq_die "squeeze stats $CTL failed: $(tail -n3 "$st.err")"
  rm -f "$st.err"
  cpu=$(proc_ticks "$SERVER_PID")
  busy=$(sys_busy)
  echo "$target $idle $du $((cpu - W2_CPU)) $((busy - W2_BUSY)) $st" >>"$SAMPLES"
  sq_log "rep $REP: idle ${target}s: du $((du / 1048576)) MiB, server CPU $(((cpu - W2_CPU) / HZ)) s"
}

export FIO_ENGINE=nbd FIO_DIRECT=0 FIO_SIZE FIO_RT_SEQ FIO_RT_RAND
for ((REP = 1; REP <= REPS; REP++)); do
  DIR=$SCR/r$REP
  SAMPLES=$OUT/raw/r$REP-samples.txt
  : >"$SAMPLES"
  start_server "$DIR"
  export FIO_TARGET="uri=nbd+unix:///?socket=$SOCK"

  run_fio w1-write
  echo "w1 $(du_bytes "$DIR/data")" >"$OUT/raw/r$REP-w1-du.txt"

  run_fio w2-randwrite
  W2_END_US=$(now_us)
  W2_CPU=$(proc_ticks "$SERVER_PID")
  W2_BUSY=$(sys_busy)
  for t in "${TIMES[@]}"; do
    wait_us=$((W2_END_US + t * 1000000 - $(now_us)))
    if ((wait_us > 0)); then sleep "$((wait_us / 1000000)).$(printf %06d $((wait_us % 1000000)))"; fi
    alive
    sample "$t"
  done

  stop_server
  rm -rf "$DIR"
done

# settle.json, its lines in results.jsonl, and the summary
SERVE_ARGS=$SERVE_ARGS python3 - "$OUT" "$REPS" "$HZ" "${TIMES[*]}" <<'PY' | sq_emit
import json, os, sys

out, reps, hz, times = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
raw = os.path.join(out, "raw")


def kv(path):
    d = {}
    with open(path) as f:
        for line in f:
            if ":" in line:
                k, v = line.split(":", 1)
                d[k.strip()] = v.strip()
    return d


def fio_write(path):
    with open(path) as f:
        t = f.read()
    j, _ = json.JSONDecoder().raw_decode(t[t.index("{"):])  # fio may print warnings first
    return j["jobs"][0]["write"]


m = kv(os.path.join(out, "machine.txt"))
doc = {
    "date": m.get("date"),
    "commit": m.get("commit"),
    "squeeze": m.get("squeeze"),
    "serve_args": os.environ["SERVE_ARGS"],
    "machine": {k: m.get(k) for k in ("cpu", "cores", "hypervisor", "mem", "kernel", "filesystem", "rustc", "fio")},
    "settings": {
        "reps": reps,
        "fio_size": os.environ["FIO_SIZE"],
        "fio_rt_seq": int(os.environ["FIO_RT_SEQ"]),
        "fio_rt_rand": int(os.environ["FIO_RT_RAND"]),
        "settle_times": [int(x) for x in times.split()],
    },
    "reps": [],
}
for r in range(1, reps + 1):
    w1 = fio_write(os.path.join(raw, f"r{r}-w1-write.json"))
    w2 = fio_write(os.path.join(raw, f"r{r}-w2-randwrite.json"))
    with open(os.path.join(raw, f"r{r}-w1-du.txt")) as f:
        w1_du = int(f.read().split()[1])
    logical = w1["io_bytes"]
    rep = {
        "rep": r,
        "w1_write_mbps": w1["bw_bytes"] / 1e6,
        "w1_bytes": logical,
        "w1_physical_bytes_du": w1_du,
        "ratio_w1": logical / w1_du,
        "w2_iops": w2["iops"],
        "w2_bytes": w2["io_bytes"],
        "samples": [],
    }
    with open(os.path.join(raw, f"r{r}-samples.txt")) as f:
        for line in f:
            target, idle_us, du, cpu, busy, st = line.split()
            with open(st) as g:
                s = json.load(g)
            s = s["vol"] if "vol" in s else next(iter(s.values()))
            idle = int(idle_us) / 1e6
            rep["samples"].append(
                {
                    "idle_s": int(target),
                    "idle_s_actual": round(idle, 3),
                    "physical_bytes_du": int(du),
                    "ratio_du": logical / int(du),
                    "compression_ratio": s["compression_ratio"],
                    "garbage_bytes": s["garbage_bytes"],
                    "merged_bytes": s.get("merged_bytes", 0),
                    "merge_bytes_written": s.get("merge_bytes_written", 0),
                    "stored_bytes": s["stored_bytes"],
                    "physical_bytes": s["physical_bytes"],
                    "server_cpu_s": int(cpu) / hz,
                    # the whole machine's busy time since W2 ended, % of one core (a noise flag)
                    "machine_busy_pct": round(100 * int(busy) / hz / idle, 1) if idle > 0.5 else None,
                }
            )
    doc["reps"].append(rep)
with open(os.path.join(out, "settle.json"), "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")

print(f"squeeze serve {doc['serve_args']}".rstrip() + f" at {doc['commit']}; FIO_SIZE={doc['settings']['fio_size']} "
      f"FIO_RT_SEQ={doc['settings']['fio_rt_seq']} FIO_RT_RAND={doc['settings']['fio_rt_rand']}")
for rep in doc["reps"]:
    print(f"rep {rep['rep']}: W1 write {rep['w1_write_mbps']:.0f} MB/s, ratio(du) {rep['ratio_w1']:.3f}; "
          f"W2 randwrite {rep['w2_iops'] / 1000:.1f}k IOPS")
    for s in rep["samples"]:
        print(f"  idle {s['idle_s']:3d}s: ratio(du) {s['ratio_du']:.3f} live {s['compression_ratio']:.3f} "
              f"garbage {s['garbage_bytes'] / 1e6:5.0f} MB merged {s['merged_bytes'] / 1e6:5.0f} MB "
              f"(wrote {s['merge_bytes_written'] / 1e6:.0f} MB) server CPU {s['server_cpu_s']:.1f} s")
# one line per repetition and sample, in results.jsonl (bench/lib.sh sq_emit)
for rep in doc["reps"]:
    head = {k: rep[k] for k in ("rep", "w1_write_mbps", "ratio_w1", "w2_iops")}
    for s in rep["samples"]:
        print(json.dumps({**head, **{k: s[k] for k in ("idle_s", "idle_s_actual", "ratio_du", "compression_ratio",
                                                        "garbage_bytes", "merged_bytes", "merge_bytes_written",
                                                        "server_cpu_s", "machine_busy_pct")}}))
PY
sq_table
sq_log "settle.json, results.jsonl, table.md and raw outputs under $OUT"
