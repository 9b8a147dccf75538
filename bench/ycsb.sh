#!/usr/bin/env bash
# bench/ycsb.sh — YCSB's core workloads against squeeze-kv and RocksDB, side by side in one run
# (issue 17; the KallaxDB seed's comparison).
#
#   bench/ycsb.sh                                     # 5 M records, 1 M ops per workload
#   RECORDS=500000 OPS=200000 bench/ycsb.sh           # a quick look (a few minutes)
#   STORES="kv rocksdb:lz4-zstd" bench/ycsb.sh        # a subset
#
# Builds `squeeze-ycsb --features rocksdb` (the rocksdb crate linked against Debian's
# librocksdb-dev, so no RocksDB is compiled: ROCKSDB_LIB_DIR is the system's), then runs, one
# process per store and one store after the other, the whole run (builds included) under the
# bench lock (bench/README.md): the load of
# RECORDS records (400-byte db_bench-like values, compress about 2:1; YCSB's hashed key names),
# the workloads (default a,b,c,f,d: YCSB's order, D inserts so it comes last) of OPS operations
# each, with THREADS threads, every thread making its writes durable every SYNC_EVERY writes
# (squeeze-kv: flush of the volume; RocksDB: WAL sync), then a compaction and the bytes on disk.
# Every store gets the same seeded operation streams.
#
# Stores (STORES, default "kv rocksdb:none rocksdb:lz4 rocksdb:lz4-zstd"): kv is squeeze-kv on a
# thin squeeze volume (default policy, zstd:3; a quarter bucket per record, four records to a
# 4 KiB bucket; kv:B for B buckets per record, e.g. kv:0.5); rocksdb:C is RocksDB
# with its default options but compression C (none, lz4, lz4-zstd: lz4 on every level, zstd on
# the bottommost) and one background job per core, the WAL on.
#
# Output: OUT/STORE.jsonl (one JSON line per phase; all of them, with "store", in
# OUT/results.jsonl), OUT/STORE.err (progress), OUT/machine.txt, and the markdown table
# (`squeeze-ycsb table`) on stdout and in OUT/table.md. No squeeze binary and no server: the
# stores run in squeeze-ycsb's process.
#
# Env: RECORDS (5000000), OPS (1000000), THREADS (2), WORKLOADS (a,b,c,f,d), SYNC_EVERY (1000),
#      STORES, DIR (scratch, default /var/tmp/squeeze-ycsb.work; emptied per store),
#      OUT (results/ycsb-<time>), BENCH_LOCK (/tmp/bench.lock), CARGO_TARGET_DIR.
# Needs: librocksdb-dev and libclang-dev (bindgen) — apt-get installed as root when missing.
set -euo pipefail

SQ_PROG=bench/ycsb.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RECORDS=${RECORDS:-5000000}
OPS=${OPS:-1000000}
THREADS=${THREADS:-2}
WORKLOADS=${WORKLOADS:-a,b,c,f,d}
SYNC_EVERY=${SYNC_EVERY:-1000}
STORES=${STORES:-kv rocksdb:none rocksdb:lz4 rocksdb:lz4-zstd}
DIR=${DIR:-/var/tmp/squeeze-ycsb.work}
TARGET=$SQ_TARGET

missing=()
[[ -e /usr/include/rocksdb/c.h ]] || missing+=(librocksdb-dev)
# (libclang.so itself: libclang-cpp.so, which other packages bring, is not what bindgen loads)
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || missing+=(libclang-dev)
if ((${#missing[@]})); then
  if [[ $(id -u) == 0 && ${INSTALL:-1} != 0 ]]; then
    sq_log "installing ${missing[*]} (apt-get; INSTALL=0 to refuse)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2 \
      || sq_die "apt-get install ${missing[*]} failed"
  else
    sq_die "missing ${missing[*]}; run: apt-get install -y ${missing[*]}"
  fi
fi

sq_lock
# Two builds: squeeze-kv runs in a binary without RocksDB, as an application embedding it would
# (librocksdb's pages would otherwise count in its resident memory), RocksDB in one with it.
sq_log "building squeeze-ycsb, without and with RocksDB (system librocksdb), in $TARGET"
sq_cargo_build -p squeeze-ycsb
cp "$TARGET/release/squeeze-ycsb" "$TARGET/release/squeeze-ycsb-kv"
ROCKSDB_LIB_DIR=/usr/lib/x86_64-linux-gnu sq_cargo_build -p squeeze-ycsb --features rocksdb
YCSB=$TARGET/release/squeeze-ycsb
YCSB_KV=$TARGET/release/squeeze-ycsb-kv
BIN=$YCSB # (machine.txt's "squeeze:" line: squeeze-ycsb --version)

sq_out ycsb "$(dirname "$DIR")"
echo "rocksdb: $(dpkg-query -W -f '${Version}' librocksdb-dev 2>/dev/null || echo '?')" >>"$OUT/machine.txt"
{
  echo "records: $RECORDS"; echo "ops: $OPS"; echo "threads: $THREADS"
  echo "workloads: $WORKLOADS"; echo "sync_every: $SYNC_EVERY"; echo "stores: $STORES"
} >>"$OUT/machine.txt"

files=()
for s in $STORES; do
  db=${s%%:*}
  comp=none
  bpk=0.25
  if [[ $s == *:* ]]; then
    if [[ $db == kv ]]; then bpk=${s#*:}; else comp=${s#*:}; fi
  fi
  name=${s/:/-}
  rm -rf "$DIR"
  sq_log "$name: $RECORDS records, workloads $WORKLOADS of $OPS ops (progress in $OUT/$name.err)"
  bin=$YCSB
  [[ $db == kv ]] && bin=$YCSB_KV
  "$bin" run --db "$db" --compression "$comp" --dir "$DIR" \
    --records "$RECORDS" --ops "$OPS" --threads "$THREADS" --workloads "$WORKLOADS" \
    --sync-every "$SYNC_EVERY" --buckets-per-key "$bpk" >"$OUT/$name.jsonl" 2>"$OUT/$name.err" \
    || { tail -n 5 "$OUT/$name.err" >&2; sq_die "$name failed (see $OUT/$name.err)"; }
  sq_result - store="$name" <"$OUT/$name.jsonl"
  files+=("$OUT/$name.jsonl")
done
rm -rf "$DIR"
"$YCSB" table "${files[@]}" | sq_table -
sq_log "results in $OUT"
