"""bench/report_nbd.py: the NBD harness passes of bench/report.py (../shared/bench/run.sh's
results.csv and raw/*.meas): one Cell per peer and workload, the pass's table and its charts.
Standard library only."""

import csv
import os

from report_common import (  # noqa: E402
    GB,
    GIB,
    NOISY_PCT,
    OTHER_COLORS,
    PEER_COLOR,
    PEER_LABEL,
    SQUEEZE_COLOR,
    WL_LABEL,
    WORKLOADS,
    bar_chart,
    f0,
    f2,
    f_iops,
    f_mbps,
    f_size,
    fail_label,
    mean,
    num,
    read_json,
    read_kv,
)


# ---------------------------------------------------------------------------
# Harness runs (../shared/bench/run.sh results.csv + raw/*.meas)
# ---------------------------------------------------------------------------
class Cell:
    """One (peer, workload): means over the repetitions whose status is ok."""

    def __init__(self, rows, meas_dir, w1_ratio=None):
        ok = [r for r in rows if r["status"] == "ok"]
        self.reps = len(rows)
        self.n_ok = len(ok)
        self.status = None if ok else fail_label(sorted({r["status"] for r in rows})[0])
        self.bs = rows[0]["bs"]
        self.notes = sorted({r["note"] for r in rows if r.get("note")})
        self.noisy = any(
            (num(r["background_busy_pct"]) or 0) >= NOISY_PCT or (num(r["others_cpu_pct"]) or 0) >= NOISY_PCT
            for r in rows
        )
        m = lambda c: mean(num(r[c]) for r in ok)  # noqa: E731
        self.mbps = m("MBps")
        self.iops = m("IOPS") if self.bs == "4k" else None
        self.server_pct = m("server_cpu_pct")
        self.busy_pct = m("system_busy_pct")
        self.bg_pct = m("background_busy_pct")
        self.others_pct = m("others_cpu_pct")
        gb = m("cpu_core_s_per_GB")
        self.machine_s_gib = gb * GIB / GB if gb is not None else None
        # Server CPU seconds per GiB: the .meas file has the server's CPU seconds over the whole
        # measurement (the CSV only has them as a % of its wall time, which it does not keep).
        srv = []
        for r in ok:
            moved = (num(r["MBps"]) or 0) * 1e6 * (num(r["runtime_s"]) or 0)
            path = os.path.join(meas_dir, f"r{r['rep']}-{r['peer']}-{r['workload']}.meas")
            if r["server_cpu_pct"] == "" or moved <= 0 or not os.path.exists(path):
                continue
            with open(path) as f:
                v = f.read().split()
            srv.append(float(v[2]) / (moved / GIB))
        self.server_s_gib = mean(srv)
        # Compression ratio: logical bytes stored / physical bytes, from the byte counts (the CSV's
        # ratio column is rounded). Kept for failed rows too (the harness measures after a failure).
        rat = [
            int(r["logical_stored_B"]) / int(r["physical_B"])
            for r in (ok or rows)
            if r["logical_stored_B"] and r["physical_B"] and int(r["physical_B"]) > 0
        ]
        self.ratio = mean(rat)
        # Backing-store bandwidth: what the write left on the backing store per second of the
        # write; for reads an estimate, app MB/s / W1 ratio (the compressed bytes to fetch).
        self.disk_mbps, self.disk_est = None, False
        wl = rows[0]["workload"]
        if wl in ("w1-write", "w3-copy"):
            d = [
                int(r["physical_B"]) / num(r["runtime_s"]) / 1e6
                for r in ok
                if r["physical_B"] and (num(r["runtime_s"]) or 0) > 0
            ]
            self.disk_mbps = mean(d)
        elif wl in ("w1-read", "w1-randread") and self.mbps is not None and w1_ratio:
            self.disk_mbps, self.disk_est = self.mbps / w1_ratio, True


class Pass:
    def __init__(self, d):
        self.dir = d
        self.name = os.path.basename(os.path.normpath(d))
        self.meta = read_kv(os.path.join(d, "pass.txt"))
        self.harness = read_kv(os.path.join(d, "machine.txt"))
        self.policy = (read_json(os.path.join(d, "policy.json")) or {}).get("policy")
        self.custom = self.meta.get("custom_name", "squeeze")
        with open(os.path.join(d, "results.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        self.reps = sorted({r["rep"] for r in rows}, key=int)
        self.peers = []
        groups = {}
        self.errors = []
        for r in rows:
            if r["peer"] not in self.peers:
                self.peers.append(r["peer"])
            if r["status"].startswith("ERROR"):
                self.errors.append(r)
            else:
                groups.setdefault((r["peer"], r["workload"]), []).append(r)
        meas = os.path.join(d, "raw")
        self.cells = {}
        for p in self.peers:
            w1 = groups.get((p, "w1-write"))
            w1_ratio = Cell(w1, meas).ratio if w1 else None
            for wl in WORKLOADS:
                if (p, wl) in groups:
                    self.cells[(p, wl)] = Cell(groups[(p, wl)], meas, w1_ratio)

    def label(self, peer, md=True):
        if peer == self.custom:
            s = f"**{peer}**" if md else peer
            return f"{s} ({policy_label(self.policy)})" if self.policy else s
        return PEER_LABEL.get(peer, peer)

    def color(self, peer):
        if peer == self.custom:
            return SQUEEZE_COLOR
        if peer in PEER_COLOR:
            return PEER_COLOR[peer]
        others = [p for p in self.peers if p != self.custom and p not in PEER_COLOR]
        return OTHER_COLORS[others.index(peer) % len(OTHER_COLORS)]

    def cell(self, peer, wl):
        return self.cells.get((peer, wl))


def policy_label(p):
    if p.get("mode") == "none":
        return "--mode none: no codec, zero detection only"
    blobs = f"blobs {f_size(p['min_blob_size'])}–{f_size(p['max_blob_size'])}"
    return f"{p['algorithm']}, {p['mode']}, required ratio {p['required_ratio']:g}, {blobs}"


def value_or_fail(c, attr, fmt):
    """A cell of the summary: the value, or why there is none."""
    if c is None:
        return "–"
    return c.status or fmt(getattr(c, attr))


def pass_markdown(ps, img_rel, prefix, cores):
    out = []
    n = len(ps.reps)
    settings = ps.harness.get("settings", "")
    serve = f"squeeze serve {ps.meta.get('serve_args', '')}".strip()
    reps = f"{n} repetition{'s' if n != 1 else ''}" + (" (values are means)" if n > 1 else "")
    out.append(
        f"PEERS=\"{ps.meta.get('peers', ' '.join(ps.peers))}\", the custom peer `{ps.custom}` being `{serve}`; "
        f"{reps}; harness settings: {ps.harness.get('settings', '?')}."
    )
    out.append("")
    out.append(
        "| peer | W1 write MB/s | W1 read MB/s | 4k randread IOPS | 4k randwrite IOPS | W3 nbdcopy MB/s "
        "| server CPU s/GiB (W1 write / read / W3) | machine CPU s/GiB (W1 write / read / W3) "
        "| ratio W1 | ratio after W2 | ratio W3 |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p in ps.peers:
        c = lambda wl: ps.cell(p, wl)  # noqa: E731

        def trio(attr):
            v = [c(wl) for wl in ("w1-write", "w1-read", "w3-copy")]
            if all(x is None or getattr(x, attr) is None for x in v):
                return "–"
            return " / ".join("–" if x is None or getattr(x, attr) is None else f2(getattr(x, attr)) for x in v)

        out.append(
            "| "
            + " | ".join(
                [
                    ps.label(p),
                    value_or_fail(c("w1-write"), "mbps", f_mbps),
                    value_or_fail(c("w1-read"), "mbps", f_mbps),
                    value_or_fail(c("w1-randread"), "iops", f_iops),
                    value_or_fail(c("w2-randwrite"), "iops", f_iops),
                    value_or_fail(c("w3-copy"), "mbps", f_mbps),
                    trio("server_s_gib"),
                    trio("machine_s_gib"),
                    value_or_fail(c("w1-write"), "ratio", f2),
                    value_or_fail(c("w2-randwrite"), "ratio", f2),
                    value_or_fail(c("w3-copy"), "ratio", f2),
                ]
            )
            + " |"
        )
    out.append("")
    notes = []
    for r in ps.errors:
        notes.append(f"{r['peer']} stopped in phase {r['workload']} (rep {r['rep']}): {r['status']}; see the raw outputs.")
    noisy = [f"{p} {wl}" for (p, wl), c in ps.cells.items() if c.noisy]
    if noisy:
        notes.append(
            f"Measured while other processes were busy (background or others' CPU ≥ {NOISY_PCT}% of a core): "
            + ", ".join(noisy)
            + "."
        )
    if any(c.server_s_gib is None and c.mbps is not None for c in ps.cells.values()):
        notes.append("In-kernel peers (btrfs, zram, plain files) have no server process: their work shows in the machine CPU only.")
    for s in notes:
        out.append(f"- {s}")
    if notes:
        out.append("")
    for kind, alt in (
        ("throughput", "MB/s per peer: W1 write, W1 read, W3"),
        ("iops", "4k IOPS per peer: randread, randwrite"),
        ("ratio", "compression ratio per peer: W1, after W2, W3"),
        ("cpu", "CPU seconds per GiB per peer: server and whole machine"),
    ):
        out.append(f"![{alt}]({img_rel}/{prefix}{kind}.svg)")
    out.append("")
    out.append("Every measurement of this run:")
    out.append("")
    out.append(
        "| peer | workload | app MB/s | IOPS | backing MB/s | server CPU % | server CPU s/GiB "
        "| machine CPU % (of {}) | machine CPU s/GiB | bg / others % | ratio | status |".format(
            100 * cores if cores else "all cores"
        )
    )
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    foot = []
    for p in ps.peers:
        for wl in WORKLOADS:
            c = ps.cell(p, wl)
            if c is None:
                continue
            disk = f_mbps(c.disk_mbps) if c.disk_mbps is not None else "–"
            if c.disk_est and c.disk_mbps is not None:
                disk = "≈" + disk
            status = "ok" if c.status is None else c.status
            if c.status is None and c.n_ok < c.reps:
                status = f"ok {c.n_ok} of {c.reps}"
            out.append(
                "| "
                + " | ".join(
                    [
                        p,
                        WL_LABEL[wl],
                        f_mbps(c.mbps),
                        f_iops(c.iops) if c.iops is not None else "",
                        disk,
                        f0(c.server_pct),
                        f2(c.server_s_gib),
                        f0(c.busy_pct),
                        f2(c.machine_s_gib),
                        f"{f0(c.bg_pct)} / {f0(c.others_pct)}",
                        f2(c.ratio) if wl in ("w1-write", "w2-randwrite", "w3-copy") else "",
                        status,
                    ]
                )
                + " |"
            )
            for note in c.notes:
                note = note.replace("stored = W1 region; overwritten in place", "").strip()
                if note:
                    foot.append(f"{p} {WL_LABEL[wl]}: {note}")
    out.append("")
    for s in foot:
        out.append(f"- {s}")
    if foot:
        out.append("")
    return out


def pass_charts(ps, tag=""):
    peers = ps.peers
    colors = [ps.color(p) for p in peers]

    def vals(wls, attr):
        res = []
        for wl in wls:
            row = []
            for p in peers:
                c = ps.cell(p, wl)
                if c is None:
                    row.append("n/a")
                elif c.status:
                    row.append(c.status)  # drawn as text where the bar would be
                else:
                    row.append(getattr(c, attr))
            res.append(row)
        return res

    charts = {}
    wls = ["w1-write", "w1-read", "w3-copy"]
    charts["throughput"] = bar_chart(
        tag + "Throughput, MB/s (higher is better)",
        [WL_LABEL[w] for w in wls],
        peers,
        colors,
        vals(wls, "mbps"),
        f_mbps,
    )
    wls = ["w1-randread", "w2-randwrite"]
    charts["iops"] = bar_chart(
        tag + "4 KiB random I/O, IOPS at QD32 (higher is better)",
        [WL_LABEL[w] for w in wls],
        peers,
        colors,
        vals(wls, "iops"),
        f_iops,
    )
    wls = ["w1-write", "w2-randwrite", "w3-copy"]
    charts["ratio"] = bar_chart(
        tag + "Compression ratio, logical / physical (higher is better)",
        ["W1 fio data (60%)", "after W2 overwrites", "W3 real files (tar)"],
        peers,
        colors,
        vals(wls, "ratio"),
        f2,
        ref=(1.0, "1.0 = no saving"),
    )
    wls = ["w1-write", "w1-read", "w3-copy"]
    server = vals(wls, "server_s_gib")
    machine = vals(wls, "machine_s_gib")
    base, top = [], []
    for srow, mrow in zip(server, machine):
        b, t = [], []
        for s, mv in zip(srow, mrow):
            if isinstance(mv, str):
                b.append(mv)
                t.append(None)
            elif s is None or isinstance(s, str):
                b.append(0.0)
                t.append(mv)
            else:
                b.append(s)
                t.append(max(0.0, mv - s))
        base.append(b)
        top.append(t)
    charts["cpu"] = bar_chart(
        tag + "CPU seconds per GiB (lower is better)",
        [WL_LABEL[w] for w in wls],
        peers,
        colors,
        base,
        f2,
        light=top,
        note="solid: the server process; pale: the rest of the machine (client, kernel, background)",
    )
    return charts


