#!/usr/bin/env python3
"""Tests of bench/report.py on a committed fixture: bench/testdata/report/ is a copy of the
outputs of a real small `bench/report.sh` run (FIO_SIZE=256m FIO_RT_SEQ=10 FIO_RT_RAND=5,
REPS=1; the harness's CSV, .meas timings, pass.txt, policy.json, machine.txt, the
`squeeze bench --json` and `squeeze scan --json` outputs; fio's own JSON is not needed), and
settle/settle.json from a smoke run of bench/settle.sh with the same fio settings (at a later
commit, with the default policy; SETTLE_TIMES="0 5 10").
bench/testdata/report-expected.md is the section report.py must produce from it.
The charts are drawn by `squeeze chart`: SQUEEZE_BIN names the binary (scripts/test.sh builds
the debug one and sets it).

  SQUEEZE_BIN=target/debug/squeeze python3 bench/test_report.py   # what scripts/test.sh runs
  UPDATE_EXPECTED=1 python3 bench/test_report.py   # after an intended change of the output
"""
import csv
import io
import json
import os
import shutil
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no bench/__pycache__ in the tree
import report  # noqa: E402

FIXTURE = os.path.join(HERE, "testdata", "report")
EXPECTED = os.path.join(HERE, "testdata", "report-expected.md")
SVG = "{http://www.w3.org/2000/svg}"


def need_bin(test):
    """Fails the test with the reason when SQUEEZE_BIN does not name a binary to draw charts with."""
    b = os.environ.get("SQUEEZE_BIN")
    if not (b and os.path.isfile(b) and os.access(b, os.X_OK)):
        test.fail(
            f"SQUEEZE_BIN={b!r}: set it to a built squeeze binary (cargo build -p squeeze; "
            "scripts/test.sh does): report.py draws its charts with `squeeze chart`"
        )


def run_report(out_base, doc=None, img=None):
    args = [out_base]
    if doc:
        args += ["--doc", doc]
    if img:
        args += ["--img-dir", img]
    buf = io.StringIO()
    with redirect_stdout(buf):
        report.main(args)
    return buf.getvalue()


def section(md, title):
    """The lines of one ### section."""
    lines = md.split("\n")
    start = lines.index(title)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("### ")), len(lines))
    return lines[start:end]


def table_row(lines, first_cell):
    for line in lines:
        if line.startswith(f"| {first_cell} |"):
            return [c.strip() for c in line.strip().strip("|").split("|")]
    raise AssertionError(f"no row starting with {first_cell!r}")


class Golden(unittest.TestCase):
    def test_section_is_the_expected_one(self):
        md = run_report(FIXTURE)
        if os.environ.get("UPDATE_EXPECTED"):
            with open(EXPECTED, "w") as f:
                f.write(md)
        with open(EXPECTED) as f:
            self.assertEqual(md, f.read())


class Tables(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.md = run_report(FIXTURE)
        cls.peers = section(cls.md, "### Peers, one harness run")
        cls.none = section(cls.md, "### squeeze `--mode none` against raw, a second harness run")

    def test_markers_and_machine(self):
        lines = self.md.rstrip("\n").split("\n")
        self.assertEqual(lines[0], report.BEGIN)
        self.assertEqual(lines[-1], report.END)
        self.assertIn("**Machine:** AMD EPYC (KVM guest), 2 cores", self.md)
        self.assertIn("kernel 6.18.44", self.md)
        self.assertIn("scratch files on ext4", self.md)
        self.assertRegex(self.md, r"at commit [0-9a-f]{7}")

    def test_peer_summary_matches_the_csv(self):
        # every peer of the first run has a summary row; W1 write MB/s and ratios as in the CSV
        with open(os.path.join(FIXTURE, "peers", "results.csv")) as f:
            rows = {(r["peer"], r["workload"]): r for r in csv.DictReader(f)}
        ps = report.Pass(os.path.join(FIXTURE, "peers"))
        self.assertEqual(ps.peers, ["nbd-raw", "nbd-qcow2-compress", "btrfs-zstd1-force", "zram-lz4", "squeeze"])
        for p in ps.peers:
            cells = table_row(self.peers, ps.label(p))
            r = rows[(p, "w1-write")]
            self.assertEqual(cells[1], report.f_mbps(float(r["MBps"])), p)
            self.assertEqual(cells[8], r["ratio"], p)
            self.assertEqual(cells[10], rows[(p, "w3-copy")]["ratio"], p)

    def test_squeeze_row_is_labelled_with_its_policy(self):
        cells = table_row(self.peers, "**squeeze** (zstd:1, aggressive, required ratio 0.875, blobs 4K–64K)")
        self.assertEqual(len(cells), 11)
        self.assertRegex(cells[6], r"^\d+\.\d\d / \d+\.\d\d / \d+\.\d\d$")  # server CPU s/GiB
        cells = table_row(self.none, "**squeeze-mode-none** (--mode none: no codec, zero detection only)")
        self.assertEqual(len(cells), 11)

    def test_qcow2_overwrites_fail_with_eio(self):
        cells = table_row(self.peers, "qemu-nbd qcow2 + compress filter (zstd)")
        self.assertEqual(cells[4], "fails (EIO)")  # 4k randwrite IOPS
        self.assertEqual(cells[9], "fails (EIO)")  # ratio after W2

    def test_kernel_peers_have_no_server_cpu(self):
        for label in ("btrfs compress-force=zstd:1 (loop)", "zram lz4 (RAM, not durable)"):
            cells = table_row(self.peers, label)
            self.assertEqual(cells[6], "–")
            self.assertRegex(cells[7], r"^\d+\.\d\d / \d+\.\d\d / \d+\.\d\d$")

    def test_server_cpu_per_gib_comes_from_the_meas_file(self):
        ps = report.Pass(os.path.join(FIXTURE, "peers"))
        c = ps.cell("squeeze", "w1-write")
        with open(os.path.join(FIXTURE, "peers", "raw", "r1-squeeze-w1-write.meas")) as f:
            server_s = float(f.read().split()[2])
        with open(os.path.join(FIXTURE, "peers", "results.csv")) as f:
            r = next(r for r in csv.DictReader(f) if r["peer"] == "squeeze" and r["workload"] == "w1-write")
        moved = float(r["MBps"]) * 1e6 * float(r["runtime_s"])
        self.assertAlmostEqual(c.server_s_gib, server_s / (moved / 2**30))
        self.assertAlmostEqual(c.ratio, int(r["logical_stored_B"]) / int(r["physical_B"]))

    def test_detail_table_has_every_measurement(self):
        def measurements(lines):
            cells = [line.strip("|").split("|") for line in lines if line.startswith("| ")]
            return [(c[0].strip(), c[1].strip()) for c in cells if c[1].strip() in report.WL_LABEL.values()]

        ps = report.Pass(os.path.join(FIXTURE, "peers"))
        want = [(p, report.WL_LABEL[wl]) for p in ps.peers for wl in report.WORKLOADS]
        self.assertEqual(measurements(self.peers), want)
        self.assertEqual(len(measurements(self.none)), 2 * 5)

    def test_engine_and_scan_tables(self):
        eng = section(self.md, "### Engine in-process: `squeeze bench`")
        cells = table_row(eng, "fio-like, 60% compressible per 4 KiB (1024 MiB)")
        self.assertTrue(cells[1].startswith("zstd:1, aggressive, 64K blobs"))
        self.assertRegex(cells[2], r"^\d+ \(\d+%\)$")
        cells = table_row(eng, "usr.tar (925 MiB)")
        self.assertRegex(cells[9], r"^\d\.\d{3} \(\d\.\d{3}\)$")
        scan = section(self.md, "### Real data: `squeeze scan` of the W3 tar")
        cells = table_row(scan, "zstd:1")
        self.assertEqual(len(cells), 8)
        self.assertIn("Recommendation of `scan`", "\n".join(scan))


class ChartSpecs(unittest.TestCase):
    """What report.py asks `squeeze chart` for (no binary needed)."""

    def test_failures_pale_amounts_and_reference_line(self):
        ps = report.Pass(os.path.join(FIXTURE, "peers"))
        charts = report.pass_charts(ps)
        iops = charts["iops"]
        self.assertEqual(iops["groups"], [report.WL_LABEL["w1-randread"], report.WL_LABEL["w2-randwrite"]])
        self.assertEqual([x["name"] for x in iops["series"]], ps.peers)
        self.assertEqual(iops["series"][ps.peers.index("squeeze")]["color"], report.SQUEEZE_COLOR)
        qcow = ps.peers.index("nbd-qcow2-compress")
        self.assertEqual(iops["cells"][1][qcow], {"text": "fails (EIO)"})
        cell = iops["cells"][0][ps.peers.index("squeeze")]
        c = ps.cell("squeeze", "w1-randread")
        self.assertEqual(cell["value"], c.iops)
        self.assertEqual(cell["label"], report.f_iops(c.iops))
        self.assertEqual(cell["tooltip"], f"squeeze, {report.WL_LABEL['w1-randread']}: {report.f_iops(c.iops)}")
        self.assertEqual(charts["ratio"]["reference"], {"value": 1.0, "label": "1.0 = no saving"})
        cpu = charts["cpu"]
        self.assertIn("pale: the rest of the machine", cpu["note"])
        cell = cpu["cells"][0][ps.peers.index("squeeze")]
        c = ps.cell("squeeze", "w1-write")
        self.assertAlmostEqual(cell["value"] + cell["pale"], c.machine_s_gib)
        self.assertEqual(cell["label"], report.f2(c.machine_s_gib))
        self.assertTrue(cell["tooltip"].endswith(f"({report.f2(c.server_s_gib)} server)"))
        # an in-kernel peer has no server process: all of its CPU is pale
        cell = cpu["cells"][0][ps.peers.index("zram-lz4")]
        self.assertEqual(cell["value"], 0.0)
        self.assertNotIn("server", cell["tooltip"])

    def test_a_missing_value_reads_n_a(self):
        spec = report.bar_chart(
            "t", ["g"], ["a", "b", "c"], ["#000", "#111", "#222"], [[None, 2.0, float("nan")]], report.f2, ref=(1.0, None)
        )
        self.assertEqual(
            spec["cells"],
            [[{"text": "n/a"}, {"value": 2.0, "label": "2.00", "tooltip": "b, g: 2.00"}, {"text": "n/a"}]],
        )
        self.assertEqual(spec["reference"], {"value": 1.0})
        self.assertNotIn("note", spec)


class Settle(unittest.TestCase):
    TITLE = "### Ratio after the overwrites, and after the clients go idle"

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)
        with open(os.path.join(FIXTURE, "settle", "settle.json")) as f:
            self.settle = json.load(f)

    def copy(self, settle=None):
        """The fixture in a scratch dir, with settle.json replaced (None: removed)."""
        out = os.path.join(self.tmp, "out")
        shutil.copytree(FIXTURE, out)
        if settle is None:
            shutil.rmtree(os.path.join(out, "settle"))
        else:
            with open(os.path.join(out, "settle", "settle.json"), "w") as f:
                f.write(settle if isinstance(settle, str) else json.dumps(settle))
        return out

    def test_one_row_per_sample_time(self):
        lines = section(run_report(FIXTURE), self.TITLE)
        rows = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
        self.assertEqual(
            rows,
            [
                "| 0 | 1.71 | 2.37 | 42 | 0 | 0.0 |",
                "| 5 | 2.41 | 2.49 | 1 | 268 | 1.9 |",
                "| 10 | 2.41 | 2.49 | 1 | 268 | 1.9 |",
            ],
        )
        self.assertIn(
            "| idle s | ratio by du | live ratio | garbage MB | merged MB | server CPU s |", lines
        )
        text = "\n".join(lines)
        self.assertIn("the 0 s row is the moment of the harness's own \"ratio after W2\" column", text)
        self.assertIn("1 repetition; ratio by du after W1 2.46, W1 write 648 MB/s, W2 45.4k IOPS.", text)
        # the table's values are the file's
        smp = self.settle["reps"][0]["samples"][0]
        self.assertEqual(table_row(lines, "0")[1:3], [report.f2(smp["ratio_du"]), report.f2(smp["compression_ratio"])])

    def test_repetitions_are_averaged(self):
        st = json.loads(json.dumps(self.settle))
        second = json.loads(json.dumps(st["reps"][0]))
        second["rep"] = 2
        for smp in second["samples"]:
            smp["ratio_du"] += 0.5
            smp["garbage_bytes"] += 10_000_000
            smp["server_cpu_s"] += 0.72
        second["samples"].append(dict(second["samples"][-1], idle_s=20))  # a time only rep 2 has
        st["reps"].append(second)
        lines = section(run_report(self.copy(st)), self.TITLE)
        self.assertEqual(table_row(lines, "5"), ["5", "2.66", "2.49", "6", "268", "2.3"])
        self.assertEqual(table_row(lines, "20"), ["20", "2.91", "2.49", "11", "268", "2.7"])
        self.assertIn("2 repetitions (values are means)", "\n".join(lines))

    def test_no_section_without_the_file(self):
        with open(EXPECTED) as f:
            expected = f.read()
        lines = expected.split("\n")
        start = lines.index(self.TITLE)
        want = "\n".join(lines[:start] + lines[start + len(section(expected, self.TITLE)) :])
        for settle in (None, "{not json", {"reps": []}):
            md = run_report(self.copy(settle))
            self.assertNotIn(self.TITLE, md)
            self.assertEqual(md, want)
            shutil.rmtree(os.path.join(self.tmp, "out"))


class Files(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)

    def test_doc_outside_the_markers_is_untouched_and_charts_are_svg(self):
        need_bin(self)
        doc = os.path.join(self.tmp, "docs", "benchmarks.md")
        img = os.path.join(self.tmp, "docs", "img")
        os.makedirs(img)
        with open(os.path.join(img, "bench-stale.svg"), "w") as f:
            f.write("<svg/>")
        with open(os.path.join(img, "keep.png"), "w") as f:
            f.write("x")
        head = "# Benchmarks\n\nHand-written.\n\n## Report\n\n"
        tail = "\n\n## Analysis\n\nMore hand-written text.\n"
        with open(doc, "w") as f:
            f.write(head + report.BEGIN + "\nNot generated yet.\n" + report.END + tail)
        md = run_report(FIXTURE, doc, img)
        with open(doc) as f:
            text = f.read()
        self.assertEqual(text, head + md.rstrip("\n") + tail)
        run_report(FIXTURE, doc, img)  # idempotent
        with open(doc) as f:
            self.assertEqual(f.read(), text)
        names = sorted(os.listdir(img))
        self.assertNotIn("bench-stale.svg", names)
        self.assertIn("keep.png", names)
        for name in names:
            if not name.endswith(".svg"):
                continue
            self.assertIn(f"](img/{name})", md)  # referenced from the section
            root = ET.parse(os.path.join(img, name)).getroot()
            self.assertEqual(root.tag, SVG + "svg")
            self.assertTrue(root.find(SVG + "title").text)
        self.assertEqual(
            [n for n in names if n.endswith(".svg")],
            sorted(
                [f"bench-{k}.svg" for k in ("throughput", "iops", "ratio", "cpu")]
                + [f"bench-none-{k}.svg" for k in ("throughput", "iops", "ratio", "cpu")]
                + ["bench-engine.svg", "bench-scan.svg"]
            ),
        )
        # one bar per peer and workload; a failure is text, not a bar
        root = ET.parse(os.path.join(img, "bench-iops.svg")).getroot()
        bars = [r for r in root.iter(SVG + "rect") if r.find(SVG + "title") is not None]
        self.assertEqual(len(bars), 5 * 2 - 1)
        self.assertIn("fails (EIO)", [t.text for t in root.iter(SVG + "text")])

    def test_section_is_added_when_the_markers_are_missing(self):
        need_bin(self)
        doc = os.path.join(self.tmp, "benchmarks.md")
        with open(doc, "w") as f:
            f.write("# Benchmarks\n\nIntro.\n\n## Engine\n\nText.\n")
        md = run_report(FIXTURE, doc, os.path.join(self.tmp, "img"))
        with open(doc) as f:
            text = f.read()
        self.assertTrue(text.startswith("# Benchmarks\n\nIntro.\n\n" + report.SECTION + "\n"))
        self.assertIn(md.rstrip("\n") + "\n\n## Engine\n\nText.\n", text)

    def test_failed_peer_and_repetitions(self):
        out = os.path.join(self.tmp, "out")
        shutil.copytree(FIXTURE, out)
        csv_path = os.path.join(out, "peers", "results.csv")
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        # a second repetition of nbd-raw's W1 write at twice the speed, and a peer that failed
        extra = dict(next(r for r in rows if r["peer"] == "nbd-raw" and r["workload"] == "w1-write"))
        first = float(extra["MBps"])
        extra.update(rep="2", MBps=f"{2 * first:.1f}")
        err = {c: "" for c in rows[0]}
        err.update(rep="1", peer="btrfs-lzo-force", workload="setup", status="ERROR(rc=1)", note="see raw")
        with open(csv_path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
            w.writerow(extra)
            w.writerow(err)
        md = run_report(out)
        lines = section(md, "### Peers, one harness run")
        cells = table_row(lines, "qemu-nbd raw file (no compression)")
        self.assertEqual(cells[1], report.f_mbps((first + 2 * first) / 2))
        self.assertIn("2 repetitions (values are means)", md)
        self.assertIn("- btrfs-lzo-force stopped in phase setup (rep 1): ERROR(rc=1); see the raw outputs.", lines)
        cells = table_row(lines, "btrfs compress-force=lzo (loop)")
        self.assertEqual(cells[1:], ["–"] * 10)

    def test_img_dir_without_the_binary_is_a_clear_error(self):
        env = os.environ.pop("SQUEEZE_BIN", None)
        try:
            with self.assertRaises(SystemExit) as e:
                run_report(FIXTURE, img=os.path.join(self.tmp, "img"))
            self.assertIn("set SQUEEZE_BIN", str(e.exception))
            with self.assertRaises(SystemExit) as e:
                report.main([FIXTURE, "--img-dir", self.tmp, "--squeeze-bin", os.path.join(self.tmp, "nothing")])
            self.assertIn("is not an executable file", str(e.exception))
        finally:
            if env is not None:
                os.environ["SQUEEZE_BIN"] = env
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "img")))

    def test_fail_label(self):
        self.assertEqual(report.fail_label("FAIL(fio error 5)"), "fails (EIO)")
        self.assertEqual(report.fail_label("FAIL(rc=1, no fio json)"), "fails (rc=1, no fio json)")
        self.assertEqual(report.fail_label("ERROR(rc=2)"), "error (rc=2)")


if __name__ == "__main__":
    unittest.main()
