#!/usr/bin/env python3
"""Results of bench/pg_fillfactor.sh (Python 3, standard library only).

  pg_fillfactor.py record RUN_DIR     one run's files -> one JSON line on stdout
  pg_fillfactor.py row RUN_DIR        one run in one human line (progress)
  pg_fillfactor.py table OUT_BASE     results.jsonl -> markdown tables on stdout
  pg_fillfactor.py write-sizes LOG [RUN_DIR...]
                                      `squeeze serve` trace log -> NBD WRITE lengths and alignment;
                                      with the runs' trace-window.txt and extents.txt: whether each
                                      8 KiB page of a relation file reached squeeze in one WRITE

A RUN_DIR holds meta.txt, sizes-run.txt, sizes-loaded.txt, upd.txt, wal.txt, blks.txt and,
with MEM_LIMIT, memory-pg.txt / memory-serve.txt (the memory groups: "key value" lines), run.out (pgbench's or sysbench's report), txlog* (pgbench's per-transaction log) and,
on squeeze, vol-before.json / vol-after.json (`squeeze stats --json`).
"""

import glob
import json
import os
import re
import sys

# /sys/block/<dev>/stat, in the kernel's order (Documentation/block/stat.rst)
LOOP_FIELDS = [
    "read_ios", "read_merges", "read_sectors", "read_ticks",
    "write_ios", "write_merges", "write_sectors", "write_ticks",
    "in_flight", "io_ticks", "time_in_queue",
    "discard_ios", "discard_merges", "discard_sectors", "discard_ticks",
    "flush_ios", "flush_ticks",
]


def read(path):
    with open(path, errors="replace") as fh:
        return fh.read()


def load_json(path):
    with open(path) as fh:
        return json.load(fh)


def kv(path):
    """'key value...' lines -> dict of strings (missing file: empty)."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            parts = line.split(None, 1)
            if len(parts) == 2:
                out[parts[0]] = parts[1].strip()
    return out


def num(s):
    try:
        return int(s)
    except (TypeError, ValueError):
        try:
            return float(s)
        except (TypeError, ValueError):
            return None


def percentile(sorted_vals, p):
    if not sorted_vals:
        return None
    k = min(len(sorted_vals) - 1, max(0, int(round(p / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[k]


def pgbench_result(d):
    """TPS from run.out, latencies (ms) from the per-transaction logs."""
    text = read(os.path.join(d, "run.out"))
    m = re.search(r"^tps = ([\d.]+)", text, re.M)
    tps = float(m.group(1)) if m else None
    m = re.search(r"number of transactions actually processed: (\d+)", text)
    txs = int(m.group(1)) if m else None
    lat = []
    for fn in glob.glob(os.path.join(d, "txlog*")):
        with open(fn) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6:
                    lat.append(int(parts[2]) / 1000.0)
    lat.sort()
    return {
        "tps": tps,
        "transactions": txs,
        "lat_avg_ms": sum(lat) / len(lat) if lat else None,
        "lat_p50_ms": percentile(lat, 50),
        "lat_p95_ms": percentile(lat, 95),
        "lat_p99_ms": percentile(lat, 99),
    }


def sysbench_histogram(text):
    """[(value_ms, count)] from sysbench's --histogram output."""
    hist = []
    in_hist = False
    for line in text.splitlines():
        if "Latency histogram" in line:
            in_hist = True
            continue
        if in_hist:
            m = re.match(r"^\s*([\d.]+)\s*\|\**\s+(\d+)\s*$", line)
            if m:
                hist.append((float(m.group(1)), int(m.group(2))))
            elif hist and not line.strip():
                break
    return hist


def hist_percentile(hist, p):
    total = sum(c for _, c in hist)
    if not total:
        return None
    want = p / 100.0 * total
    acc = 0
    for v, c in hist:
        acc += c
        if acc >= want:
            return v
    return hist[-1][0]


def sysbench_result(d):
    text = read(os.path.join(d, "run.out"))
    m = re.search(r"transactions:\s+(\d+)\s+\(([\d.]+) per sec", text)
    txs, tps = (int(m.group(1)), float(m.group(2))) if m else (None, None)
    m = re.search(r"avg:\s+([\d.]+)", text)
    avg = float(m.group(1)) if m else None
    hist = sysbench_histogram(text)
    return {
        "tps": tps,
        "transactions": txs,
        "lat_avg_ms": avg,
        "lat_p50_ms": hist_percentile(hist, 50),
        "lat_p95_ms": hist_percentile(hist, 95),
        "lat_p99_ms": hist_percentile(hist, 99),
    }


def loop_delta(before, after):
    b = [int(x) for x in before.split()]
    a = [int(x) for x in after.split()]
    return {k: a[i] - b[i] for i, k in enumerate(LOOP_FIELDS) if i < len(a) and i < len(b)}


def record(d):
    meta = kv(os.path.join(d, "meta.txt"))
    w = meta["workload"]
    r = {
        "side": meta["side"],
        "workload": w,
        "fillfactor": int(meta["fillfactor"]),
        "load_seconds": num(meta.get("load_seconds")),
        "db_phys_bytes": num(meta.get("db_phys_bytes")),
        "phys_with_db": num(meta.get("phys_with_db")),
        "phys_without_db": num(meta.get("phys_without_db")),
        "load_average": meta.get("load_average"),
    }
    r.update(pgbench_result(d) if w == "pgbench" else sysbench_result(d))
    for name, f in (("loaded", "sizes-loaded.txt"), ("run", "sizes-run.txt")):
        for k, v in kv(os.path.join(d, f)).items():
            r[f"{k}_{name}"] = num(v)
    for f in ("upd.txt", "wal.txt", "blks.txt"):
        for k, v in kv(os.path.join(d, f)).items():
            r[k] = num(v)
    for key, f in (("memory_pg", "memory-pg.txt"), ("memory_serve", "memory-serve.txt")):
        m = {k: num(v) for k, v in kv(os.path.join(d, f)).items()}
        if m:
            r[key] = m
    if "loop_before" in meta and "loop_after" in meta:
        r["loop"] = loop_delta(meta["loop_before"], meta["loop_after"])
    tck = num(meta.get("clk_tck")) or 100
    r["stack_cpu_seconds"] = (num(meta.get("stack_cpu_ticks")) or 0) / tck
    vb, va = os.path.join(d, "vol-before.json"), os.path.join(d, "vol-after.json")
    if os.path.exists(vb) and os.path.exists(va):
        b, a = load_json(vb), load_json(va)
        r["squeeze_run"] = {
            k: a[k] - b[k]
            for k in ("bytes_written", "log_bytes_written", "checkpoint_bytes_written",
                      "compress_cpu_seconds", "blobs_compressed", "blobs_rejected",
                      "blobs_skipped", "merge_bytes_written", "cleaner_bytes_moved")
            if k in a and k in b
        }
        r["squeeze_after"] = {k: a.get(k) for k in ("stored_bytes", "physical_bytes",
                                                     "garbage_bytes", "compression_ratio")}
    return r


def derived(r):
    """Per-transaction and per-I/O figures from a record."""
    out = {}
    tx = r.get("transactions") or 0
    loop = r.get("loop") or {}
    if tx:
        if r.get("wal_bytes") is not None:
            out["wal_kib_per_tx"] = r["wal_bytes"] / tx / 1024
        if r.get("wal_fpi") is not None:
            out["fpi_per_tx"] = r["wal_fpi"] / tx
        if loop:
            out["flushes_per_tx"] = loop.get("flush_ios", 0) / tx
            out["written_kib_per_tx"] = loop.get("write_sectors", 0) * 512 / tx / 1024
            out["loop_reads_per_tx"] = loop.get("read_ios", 0) / tx
        if r.get("blks_read") is not None:
            out["blks_read_per_tx"] = r["blks_read"] / tx
    if loop.get("read_ios"):
        out["avg_read_kib"] = loop["read_sectors"] * 512 / loop["read_ios"] / 1024
        out["avg_read_ms"] = loop["read_ticks"] / loop["read_ios"]
    if loop.get("write_ios"):
        out["avg_write_kib"] = loop["write_sectors"] * 512 / loop["write_ios"] / 1024
        out["avg_write_ms"] = loop["write_ticks"] / loop["write_ios"]
    if loop.get("flush_ios"):
        out["avg_flush_ms"] = loop["flush_ticks"] / loop["flush_ios"]
    upd = r.get("n_tup_upd") or 0
    if upd:
        out["hot_pct"] = 100.0 * (r.get("n_tup_hot_upd") or 0) / upd
    if r.get("db_phys_bytes") and r.get("database_bytes_run"):
        out["logical_over_phys"] = r["database_bytes_run"] / r["db_phys_bytes"]
    if tx and r.get("stack_cpu_seconds"):
        out["stack_cpu_ms_per_tx"] = 1000.0 * r["stack_cpu_seconds"] / tx
    return out


def f(v, fmt="{:.0f}"):
    return "–" if v is None else fmt.format(v)


MIB = 1 << 20


def row(d):
    r = record(d)
    x = derived(r)
    print(
        f"  {r['side']} {r['workload']} ff={r['fillfactor']}: tps {f(r.get('tps'))}, "
        f"p95 {f(r.get('lat_p95_ms'), '{:.1f}')} ms, HOT {f(x.get('hot_pct'))}%, "
        f"db {f((r.get('database_bytes_run') or 0) / MIB)} MiB logical, "
        f"{f((r.get('db_phys_bytes') or 0) / MIB)} MiB physical, "
        f"flush {f(x.get('avg_flush_ms'), '{:.2f}')} ms, write {f(x.get('avg_write_kib'), '{:.1f}')} KiB avg, "
        f"reads/tx loop {f(x.get('loop_reads_per_tx'), '{:.2f}')} blks_read {f(x.get('blks_read_per_tx'), '{:.2f}')}"
        + (f", memory peak {f(r['memory_pg'].get('max_usage_bytes', 0) / MIB)} MiB of "
           f"{f(r['memory_pg'].get('limit_bytes', 0) / MIB)}, failcnt {f(r['memory_pg'].get('failcnt'))}"
           if r.get("memory_pg") else "")
    )


def load(out_base):
    rows = []
    with open(os.path.join(out_base, "results.jsonl")) as fh:
        for line in fh:
            if line.strip():
                rows.append(json.loads(line))
    return rows


def median(vals):
    vals = sorted(v for v in vals if v is not None)
    if not vals:
        return None
    n = len(vals)
    return vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2


def side_by_side(w, rows, sides, ffs):
    """The headline: per fillfactor, every side's TPS, reads per transaction and physical
    bytes in one row (medians of repeated runs)."""
    def med(s, ff, fn):
        return median([fn(r) for r in rows if r["side"] == s and r["fillfactor"] == ff])
    print(f"Side by side ({w}; reads/tx: the loop device's reads, then PostgreSQL's blks_read; "
          "physical: the database's bytes, and against fillfactor 100):\n")
    head = ["ff"]
    for s in sides:
        head += [f"{s} TPS", f"{s} reads/tx", f"{s} physical MiB"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for ff in ffs:
        cells = [str(ff)]
        for s in sides:
            phys = med(s, ff, lambda r: r.get("db_phys_bytes"))
            base = med(s, 100, lambda r: r.get("db_phys_bytes"))
            vs = f" ({phys / base:.2f}x)" if phys is not None and base else ""
            cells += [
                f(med(s, ff, lambda r: r.get("tps"))),
                f"{f(med(s, ff, lambda r: derived(r).get('loop_reads_per_tx')), '{:.2f}')} / "
                f"{f(med(s, ff, lambda r: derived(r).get('blks_read_per_tx')), '{:.2f}')}",
                f(None if phys is None else phys / MIB) + vs,
            ]
        print("| " + " | ".join(cells) + " |")
    print()


def memory_table(w, rows, sides, ffs):
    """The memory groups during each run (MEM_LIMIT): nothing when the run had none."""
    if not any(r.get("memory_pg") for r in rows):
        return
    print(f"Memory groups during the run ({w}; MiB; PostgreSQL's group, then the squeeze "
          "server's where it had one):\n")
    print("| side | ff | limit | peak | failcnt | cache | rss | shmem "
          "| server limit | server peak | server cache | server rss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def mib(m, k):
        v = (m or {}).get(k)
        if v is None:
            return "–"
        return "none" if k == "limit_bytes" and v >= 1 << 50 else f"{v / MIB:.0f}"
    for ff in ffs:
        for s in sides:
            for r in [r for r in rows if r["side"] == s and r["fillfactor"] == ff]:
                m, v = r.get("memory_pg"), r.get("memory_serve")
                print(f"| {s} | {ff} | {mib(m, 'limit_bytes')} | {mib(m, 'max_usage_bytes')} "
                      f"| {f((m or {}).get('failcnt'))} | {mib(m, 'cache')} | {mib(m, 'rss')} "
                      f"| {mib(m, 'shmem')} | {mib(v, 'limit_bytes')} | {mib(v, 'max_usage_bytes')} "
                      f"| {mib(v, 'cache')} | {mib(v, 'rss')} |")
    print()


def table(out_base):
    rows = load(out_base)
    machine = read(os.path.join(out_base, "machine.txt")).strip()
    print("Machine and settings:\n")
    print("```\n" + machine + "\n```\n")
    workloads = [w for w in ("pgbench", "sysbench") if any(r["workload"] == w for r in rows)]
    sides = [s for s in ("squeeze", "plain", "host") if any(r["side"] == s for r in rows)]
    ffs = sorted({r["fillfactor"] for r in rows}, reverse=True)
    for w in workloads:
        name = {"pgbench": "pgbench TPC-B-like (blank filler)",
                "sysbench": "sysbench oltp_update_non_index (random-digit rows)"}[w]
        print(f"### {name}\n")
        print("| side | ff | TPS | lat avg / p50 / p95 / p99 ms | HOT % | WAL KiB/tx | FPI/tx "
              "| table MiB | all tables MiB | db physical MiB | logical/physical "
              "| loop KiB/tx | avg write KiB | flushes/tx | avg flush ms | stack CPU ms/tx "
              "| loop reads/tx | blks_read/tx | avg read KiB | avg read ms |")
        print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
              "|---:|---:|---:|---:|")
        for ff in ffs:
            for s in sides:
                for r in [r for r in rows if r["workload"] == w and r["side"] == s and r["fillfactor"] == ff]:
                    x = derived(r)
                    lat = " / ".join(f(r.get(k), "{:.1f}") for k in
                                     ("lat_avg_ms", "lat_p50_ms", "lat_p95_ms", "lat_p99_ms"))
                    print(
                        f"| {s} | {ff} | {f(r.get('tps'))} | {lat} | {f(x.get('hot_pct'))} "
                        f"| {f(x.get('wal_kib_per_tx'), '{:.1f}')} | {f(x.get('fpi_per_tx'), '{:.2f}')} "
                        f"| {f((r.get('table_bytes_run') or 0) / MIB)} "
                        f"| {f((r.get('all_tables_total_bytes_run') or 0) / MIB)} "
                        f"| {f((r.get('db_phys_bytes') or 0) / MIB)} "
                        f"| {f(x.get('logical_over_phys'), '{:.2f}')} "
                        f"| {f(x.get('written_kib_per_tx'), '{:.1f}')} "
                        f"| {f(x.get('avg_write_kib'), '{:.1f}')} "
                        f"| {f(x.get('flushes_per_tx'), '{:.2f}')} "
                        f"| {f(x.get('avg_flush_ms'), '{:.2f}')} "
                        f"| {f(x.get('stack_cpu_ms_per_tx'), '{:.2f}')} "
                        f"| {f(x.get('loop_reads_per_tx'), '{:.2f}')} "
                        f"| {f(x.get('blks_read_per_tx'), '{:.2f}')} "
                        f"| {f(x.get('avg_read_kib'), '{:.1f}')} "
                        f"| {f(x.get('avg_read_ms'), '{:.2f}')} |"
                    )
        print()
        side_by_side(w, [r for r in rows if r["workload"] == w], sides, ffs)
        memory_table(w, [r for r in rows if r["workload"] == w], sides, ffs)
        # the targets: medians when a configuration ran more than once
        def med(s, ff, key):
            return median([r.get(key) for r in rows
                           if r["workload"] == w and r["side"] == s and r["fillfactor"] == ff])
        peers = [p for p in sides if p != "squeeze"] if "squeeze" in sides else []
        print(f"Against fillfactor 100 and against the other sides ({w}; medians of repeated runs):\n")
        head = ["ff"]
        for s in sides:
            head += [f"{s} TPS vs ff 100", f"{s} physical vs ff 100"]
        head += ["logical vs ff 100"]
        for p in peers:
            head += [f"squeeze/{p} TPS", f"squeeze/{p} physical"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---:|" * len(head))

        def ratio(a, b):
            return None if a is None or not b else a / b
        for ff in ffs:
            cells = []
            for s in sides:
                cells += [ratio(med(s, ff, "tps"), med(s, 100, "tps")),
                          ratio(med(s, ff, "db_phys_bytes"), med(s, 100, "db_phys_bytes"))]
            cells.append(ratio(med(sides[0], ff, "database_bytes_run"),
                               med(sides[0], 100, "database_bytes_run")))
            for p in peers:
                cells += [ratio(med("squeeze", ff, "tps"), med(p, ff, "tps")),
                          ratio(med("squeeze", ff, "db_phys_bytes"), med(p, ff, "db_phys_bytes"))]
            print(f"| {ff} | " + " | ".join(f(c, "{:.2f}x") for c in cells) + " |")
        print()
    for s in sides:
        p = os.path.join(out_base, f"volume-{s}.json")
        if os.path.exists(p):
            v = load_json(p)
            if s == "squeeze":
                print(f"Whole squeeze volume at the end (WAL, catalogs, file system): physical "
                      f"{v['physical_bytes'] / MIB:.0f} MiB, stored {v['stored_bytes'] / MIB:.0f} MiB, "
                      f"garbage {v['garbage_bytes'] / MIB:.0f} MiB, mapped {v['mapped_bytes'] / MIB:.0f} MiB, "
                      f"ratio {v['compression_ratio']:.2f}, write amplification "
                      f"{v['write_amplification']:.2f}.\n")
            elif s == "plain":
                print(f"Whole plain file at the end: {v['physical_bytes'] / MIB:.0f} MiB allocated.\n")
            else:
                print(f"Whole data directory on the host at the end: {v['physical_bytes'] / MIB:.0f} MiB.\n")
    for s in sides:
        p = os.path.join(out_base, f"pg_test_fsync-{s}.txt")
        if os.path.exists(p):
            m = re.search(r"^\s*fdatasync\s+([\d.,]+) ops/sec\s+([\d.,]+) usecs/op", read(p), re.M)
            if m:
                print(f"pg_test_fsync on {s}: one 8 KiB write + fdatasync: {m.group(1)} ops/s, "
                      f"{m.group(2)} us/op.\n")


TRACE_RE = re.compile(r'^(\S+) .*cmd="(\w+)" offset=(\d+) len=(\d+)')
EXTENT_RE = re.compile(r"^\s*\d+:\s+(\d+)\.\.\s*(\d+):\s+(\d+)\.\.\s*(\d+):\s+(\d+):")


def trace_requests(log):
    """(timestamp, cmd, offset, length) of every request in a `squeeze serve` trace log."""
    with open(log, errors="replace") as fh:
        for line in fh:
            m = TRACE_RE.search(line)
            if m:
                yield m.group(1), m.group(2), int(m.group(3)), int(m.group(4))


def extents(path, block=4096):
    """[(device_start, device_end, file, file_offset)] from bench's `filefrag -e` dump."""
    out = []
    name = None
    with open(path) as fh:
        for line in fh:
            if line.startswith("FILE "):
                name = line[5:].strip()
                continue
            m = re.search(r"blocks of (\d+) bytes", line)
            if m:
                block = int(m.group(1))
                continue
            m = EXTENT_RE.match(line)
            if m and name:
                lstart, _lend, pstart, _pend, n = (int(g) for g in m.groups())
                out.append((pstart * block, (pstart + n) * block, name, lstart * block))
    out.sort()
    return out


def kind(name):
    if name.startswith("pg_wal/"):
        return "wal"
    if name.startswith("base/") or name.startswith("global/"):
        return "relation"
    return "other file"


def pages_in_writes(log, run_dirs, page=8192, max_blob=131072):
    """For each run with a trace window and an extent dump: how the relation files' 8 KiB
    pages reached squeeze (whole in one WRITE or split over two; inside one blob or across the
    blob cut squeeze makes every max_blob bytes from the start of a WRITE)."""
    import bisect
    reqs = list(trace_requests(log))
    total = {}
    for d in run_dirs:
        wf, ef = os.path.join(d, "trace-window.txt"), os.path.join(d, "extents.txt")
        if not (os.path.exists(wf) and os.path.exists(ef)):
            continue
        win = kv(wf)
        ext = extents(ef)
        starts = [e[0] for e in ext]
        c = {"writes": 0, "bytes": 0, "wal": 0, "relation": 0, "other file": 0, "unmapped": 0,
             "pages_whole": 0, "pages_split": 0, "pages_across_blob_cut": 0}
        for ts, cmd, off, ln in reqs:
            if cmd != "write" or not (win["from"] <= ts <= win.get("to", "~")):
                continue
            c["writes"] += 1
            c["bytes"] += ln
            end = off + ln
            i = max(0, bisect.bisect_right(starts, off) - 1)
            kinds = set()
            mapped = 0
            while i < len(ext) and ext[i][0] < end:
                ds, de, name, fo = ext[i]
                lo, hi = max(ds, off), min(de, end)
                i += 1
                if lo >= hi:
                    continue
                mapped += hi - lo
                k = kind(name)
                kinds.add(k)
                if k != "relation":
                    continue
                # the file range this WRITE carries: [fo + lo - ds, fo + hi - ds)
                f0, f1 = fo + lo - ds, fo + hi - ds
                first, last = f0 // page, (f1 - 1) // page
                for pg_no in range(first, last + 1):
                    p0, p1 = pg_no * page, (pg_no + 1) * page
                    if p0 < f0 or p1 > f1:
                        c["pages_split"] += 1
                        continue
                    c["pages_whole"] += 1
                    r = lo + (p0 - f0) - off  # the page's place in the WRITE
                    if r // max_blob != (r + page - 1) // max_blob:
                        c["pages_across_blob_cut"] += 1
            for k in kinds:
                c[k] += 1
            if mapped < ln:
                c["unmapped"] += 1
        name = os.path.basename(d.rstrip("/"))
        print(f"{name}: {c['writes']} WRITEs ({c['bytes'] / MIB:.1f} MiB) in the run and its checkpoint; "
              f"touching WAL {c['wal']}, relation files {c['relation']}, other files {c['other file']}, "
              f"not in any file (journal, metadata) {c['unmapped']}; relation pages: whole in one WRITE "
              f"{c['pages_whole']}, split over two WRITEs {c['pages_split']}, whole but across a "
              f"{max_blob // 1024} KiB blob cut {c['pages_across_blob_cut']}")
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    if total:
        print(f"all runs: relation pages whole in one WRITE {total['pages_whole']}, split over two "
              f"WRITEs {total['pages_split']}, whole but across a blob cut {total['pages_across_blob_cut']}")


def write_sizes(log, run_dirs=()):
    """NBD WRITE requests in a `squeeze serve` trace log: lengths, 8 KiB alignment; then,
    with run directories, where the relation files' pages went (pages_in_writes)."""
    lens = {}
    cmds = {}
    writes = aligned8 = crosses128 = 0
    for _ts, cmd, off, ln in trace_requests(log):
        cmds[cmd] = cmds.get(cmd, 0) + 1
        if cmd != "write":
            continue
        writes += 1
        lens[ln] = lens.get(ln, 0) + 1
        if off % 8192 == 0 and ln % 8192 == 0:
            aligned8 += 1
        if ln <= 131072 and off // 131072 != (off + ln - 1) // 131072:
            crosses128 += 1
    print("whole trace (pg_test_fsync's O_DIRECT 1-16 KiB writes included): requests: "
          + ", ".join(f"{k} {v}" for k, v in sorted(cmds.items())))
    if not writes:
        print("no WRITE requests")
        return
    print(f"WRITE requests: {writes}; offset and length both multiples of 8 KiB: "
          f"{aligned8} ({100.0 * aligned8 / writes:.1f}%); up to 128 KiB and crossing a 128 KiB "
          f"boundary of the device: {crosses128}")
    print("most common lengths:")
    for ln, c in sorted(lens.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {ln:>9} bytes: {c} ({100.0 * c / writes:.1f}%)")
    if run_dirs:
        pages_in_writes(log, run_dirs)


def main(argv):
    if len(argv) < 3 or argv[1] not in ("record", "row", "table", "write-sizes") \
            or (len(argv) > 3 and argv[1] != "write-sizes"):
        sys.exit(__doc__)
    cmd, arg = argv[1], argv[2]
    if cmd == "record":
        print(json.dumps(record(arg), sort_keys=True))
    elif cmd == "row":
        row(arg)
    elif cmd == "table":
        table(arg)
    else:
        write_sizes(arg, argv[3:])


if __name__ == "__main__":
    main(sys.argv)
