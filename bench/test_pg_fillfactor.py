#!/usr/bin/env python3
"""Tests of bench/pg_fillfactor.py on a committed fixture and on made-up trace inputs.

bench/testdata/pg_fillfactor/ holds two run directories of a real `bench/pg_fillfactor.sh
--quick` run (pgbench and sysbench at fillfactor 70 on squeeze; pgbench's per-transaction
logs included, the load logs left out), its machine.txt, the sysbench rows at fillfactor 100
and 70 of its results.jsonl, and its volume and pg_test_fsync outputs.

  python3 bench/test_pg_fillfactor.py       # what scripts/test.sh runs
"""
import io
import os
import re
import shutil
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no bench/__pycache__ in the tree
import pg_fillfactor as pf  # noqa: E402

FIXTURE = os.path.join(HERE, "testdata", "pg_fillfactor")


class RunRecords(unittest.TestCase):
    def test_sysbench_percentile_from_the_histogram_is_sysbenchs_own(self):
        r = pf.record(os.path.join(FIXTURE, "sysbench-ff70-squeeze"))
        text = pf.read(os.path.join(FIXTURE, "sysbench-ff70-squeeze", "run.out"))
        own95 = float(re.search(r"95th percentile:\s+([\d.]+)", text).group(1))
        self.assertEqual(r["lat_p95_ms"], own95)  # sysbench computes it from the same buckets
        self.assertEqual(r["transactions"], 13065)
        self.assertAlmostEqual(r["tps"], 2602.19)
        self.assertLessEqual(r["lat_p50_ms"], r["lat_p95_ms"])
        self.assertLessEqual(r["lat_p95_ms"], r["lat_p99_ms"])

    def test_pgbench_latencies_come_from_every_logged_transaction(self):
        d = os.path.join(FIXTURE, "pgbench-ff70-squeeze")
        r = pf.record(d)
        logged = sum(len(pf.read(os.path.join(d, fn)).splitlines())
                     for fn in os.listdir(d) if fn.startswith("txlog"))
        self.assertEqual(logged, r["transactions"])  # both threads' logs, every line
        text = pf.read(os.path.join(d, "run.out"))
        avg = float(re.search(r"latency average = ([\d.]+) ms", text).group(1))
        self.assertAlmostEqual(r["lat_avg_ms"], avg, delta=avg * 0.05)
        self.assertLessEqual(r["lat_p50_ms"], r["lat_p95_ms"])

    def test_record_reads_sizes_counters_and_the_loop_device(self):
        r = pf.record(os.path.join(FIXTURE, "sysbench-ff70-squeeze"))
        self.assertEqual((r["side"], r["workload"], r["fillfactor"]), ("squeeze", "sysbench", 70))
        self.assertEqual(r["db_phys_bytes"], r["phys_with_db"] - r["phys_without_db"])
        self.assertGreater(r["database_bytes_run"], r["db_phys_bytes"])  # compressed
        self.assertLessEqual(r["n_tup_hot_upd"], r["n_tup_upd"])
        self.assertGreater(r["loop"]["write_ios"], 0)
        self.assertGreater(r["loop"]["flush_ios"], 0)
        self.assertGreater(r["squeeze_run"]["bytes_written"], 0)
        x = pf.derived(r)
        self.assertAlmostEqual(x["avg_write_kib"],
                               r["loop"]["write_sectors"] / 2 / r["loop"]["write_ios"])

    def test_loop_delta_names_the_kernels_fields(self):
        before = " ".join(str(i) for i in range(17))
        after = " ".join(str(10 * i) for i in range(17))
        d = pf.loop_delta(before, after)
        self.assertEqual(d["write_ios"], 36)  # field 5: 40 - 4
        self.assertEqual(d["flush_ios"], 135)  # field 16
        self.assertEqual(d["flush_ticks"], 144)
        self.assertEqual(pf.loop_delta("", ""), {})


class ReadsAndMemory(unittest.TestCase):
    """A run under MEM_LIMIT: the fixture's sysbench run with blks.txt and the memory groups'
    files added, as bench/pg_fillfactor.sh writes them."""

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.run = os.path.join(self.dir, "sysbench-ff70-squeeze")
        shutil.copytree(os.path.join(FIXTURE, "sysbench-ff70-squeeze"), self.run)
        with open(os.path.join(self.run, "blks.txt"), "w") as f:
            f.write("blks_read 26130\nblks_hit 900000\n")
        with open(os.path.join(self.run, "memory-pg.txt"), "w") as f:
            f.write("limit_bytes 201326592\nusage_bytes 200000000\nmax_usage_bytes 201326592\n"
                    "failcnt 5123\ncache 150000000\nrss 40000000\nshmem 52000000\n")
        with open(os.path.join(self.run, "memory-serve.txt"), "w") as f:
            f.write(f"limit_bytes {9223372036854771712}\nmax_usage_bytes 300000000\n"
                    "cache 250000000\nrss 50000000\n")
        meta = os.path.join(self.run, "meta.txt")
        text = pf.read(meta)
        # 1306.5 reads of 8 KiB taking 2 ms each in the loop device's delta
        b = [0] * 17
        a = [0] * 17
        a[0], a[2], a[3] = 13065 * 2, 13065 * 2 * 16, 13065 * 2 * 2
        text = re.sub(r"^loop_before .*$", "loop_before " + " ".join(map(str, b)), text, flags=re.M)
        text = re.sub(r"^loop_after .*$", "loop_after " + " ".join(map(str, a)), text, flags=re.M)
        with open(meta, "w") as f:
            f.write(text)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def test_reads_per_transaction_from_the_loop_device_and_blks_read(self):
        r = pf.record(self.run)
        self.assertEqual((r["blks_read"], r["blks_hit"]), (26130, 900000))
        x = pf.derived(r)
        self.assertAlmostEqual(x["loop_reads_per_tx"], 2.0)  # 26130 reads / 13065 transactions
        self.assertAlmostEqual(x["blks_read_per_tx"], 2.0)
        self.assertAlmostEqual(x["avg_read_kib"], 8.0)
        self.assertAlmostEqual(x["avg_read_ms"], 2.0)

    def test_memory_groups_are_recorded_and_tabled(self):
        r = pf.record(self.run)
        self.assertEqual(r["memory_pg"]["failcnt"], 5123)
        self.assertEqual(r["memory_serve"]["cache"], 250000000)
        buf = io.StringIO()
        with redirect_stdout(buf):
            pf.memory_table("sysbench", [r], ["squeeze"], [70])
        line = [ln for ln in buf.getvalue().splitlines() if ln.startswith("| squeeze | 70 |")][0]
        cells = [c.strip() for c in line.strip("|").split("|")]
        # limit, peak, failcnt, cache, rss, shmem; the server: no limit, peak, cache, rss
        self.assertEqual(cells[2:], ["192", "192", "5123", "143", "38", "50", "none", "286", "238", "48"])

    def test_no_memory_table_without_a_memory_group(self):
        r = pf.record(os.path.join(FIXTURE, "sysbench-ff70-squeeze"))
        self.assertNotIn("memory_pg", r)
        buf = io.StringIO()
        with redirect_stdout(buf):
            pf.memory_table("sysbench", [r], ["squeeze"], [70])
        self.assertEqual(buf.getvalue(), "")


class Table(unittest.TestCase):
    def test_ratios_against_ff100_and_against_the_plain_file(self):
        buf = io.StringIO()
        with redirect_stdout(buf):
            pf.table(FIXTURE)
        out = buf.getvalue()
        rows = {}
        for line in out.splitlines():
            if line.startswith("| 70 |") or line.startswith("| 100 |"):
                cells = [c.strip() for c in line.strip("|").split("|")]
                if cells[-1].endswith("x"):
                    rows[cells[0]] = cells
        # squeeze tps 2602.19 / 3267.43; physical 12451723 / 11280889; plain tps 1437.46 / 2701.17;
        # squeeze/plain at 70: tps 2602.19 / 1437.46, physical 12451723 / 43556864
        self.assertEqual(rows["70"][1:], ["0.80x", "1.10x", "0.53x", "1.31x", "1.31x", "1.81x", "0.29x"])
        self.assertEqual(rows["100"][1:3], ["1.00x", "1.00x"])
        self.assertIn("pg_test_fsync on squeeze", out)
        # the side-by-side table: TPS, reads/tx (no blks.txt in the fixture), physical MiB
        side = [ln for ln in out.splitlines() if ln.startswith("| 70 |") and "MiB" not in ln
                and "(" in ln]
        self.assertEqual(len(side), 1)
        cells = [c.strip() for c in side[0].strip("|").split("|")]
        # squeeze: 2602 TPS, no reads, 12451723 bytes = 11.9 MiB, 1.10x its ff 100; plain 1437
        self.assertEqual(cells[1:4], ["2602", "0.00 / –", "12 (1.10x)"])
        self.assertEqual(cells[4], "1437")
        self.assertIn("Whole squeeze volume at the end", out)


class PagesInWrites(unittest.TestCase):
    """A relation file whose first block sits at an odd 4 KiB block of the device, so its
    8 KiB pages are 4 KiB-aligned on the device but not 8 KiB-aligned."""

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        run = os.path.join(self.dir, "pgbench-ff100-squeeze")
        os.mkdir(run)
        with open(os.path.join(run, "extents.txt"), "w") as f:
            f.write("FILE base/5/16384\n")
            f.write("File size of x is 1048576 (256 blocks of 4096 bytes)\n")
            f.write(" ext:     logical_offset:        physical_offset: length:   expected: flags:\n")
            f.write("   0:        0..     255:       1001..      1256:    256:             last,eof\n")
            f.write("FILE pg_wal/000000010000000000000001\n")
            f.write("   0:        0..     255:       5000..      5255:    256:             last,eof\n")
        with open(os.path.join(run, "trace-window.txt"), "w") as f:
            f.write("from 2026-01-01T00:00:01.000000Z\nto 2026-01-01T00:00:09.000000Z\n")
        base = 1001 * 4096
        reqs = [
            ("00:00:00.5", "write", base, 8192),            # before the window
            ("00:00:02", "write", base, 8192),              # page 0, whole
            ("00:00:03", "write", base + 8192, 4096),       # page 1, first half
            ("00:00:03", "write", base + 12288, 4096),      # page 1, second half
            # 108 KiB of unmapped blocks, then pages 0, 1 and 2 whole; page 2 starts 124 KiB
            # into the WRITE: across the 128 KiB blob cut
            ("00:00:04", "write", base - 110592, 110592 + 24576),
            ("00:00:05", "write", 5000 * 4096, 8192),       # WAL
            ("00:00:06", "write", 4096, 4096),              # journal: no file
            ("00:00:07", "flush", 0, 0),
        ]
        self.log = os.path.join(self.dir, "serve-trace.log")
        with open(self.log, "w") as f:
            for ts, cmd, off, ln in reqs:
                f.write(f"2026-01-01T{ts.zfill(8)}{'.000000' if '.' not in ts else '00000'}Z TRACE "
                        f"squeeze_nbd::server::transmission: request conn=1 cmd=\"{cmd}\" "
                        f"offset={off} len={ln}\n")
        self.run_dir = run

    def test_whole_split_and_across_the_blob_cut(self):
        buf = io.StringIO()
        with redirect_stdout(buf):
            pf.pages_in_writes(self.log, [self.run_dir])
        out = buf.getvalue()
        self.assertIn("6 WRITEs", out)  # the one before the window is not counted
        self.assertIn("whole in one WRITE 4,", out)  # page 0 twice, pages 1 and 2
        self.assertIn("split over two WRITEs 2,", out)  # page 1's halves, one in each
        self.assertIn("across a 128 KiB blob cut 1", out)  # page 2
        self.assertIn("touching WAL 1", out)
        self.assertIn("not in any file (journal, metadata) 2", out)

    def test_write_sizes_counts_lengths(self):
        buf = io.StringIO()
        with redirect_stdout(buf):
            pf.write_sizes(self.log)
        out = buf.getvalue()
        self.assertIn("WRITE requests: 7", out)
        self.assertIn("flush 1", out)


if __name__ == "__main__":
    unittest.main(verbosity=1)
