#!/usr/bin/env python3
"""bench/guest_profile.py DIR: where the guest's CPU went over each job of a
bench/guest_path.sh run made with PROFILE=1 (DIR is its guest/ directory:
results.tsv and each job's REP-PATH-JOB.tasks0/.tasks1 snapshots, taken by
bench/guest/path.sh just outside the job's window).

Prints markdown: per path and job, CPU seconds per GiB the device moved,
split (1) by /proc/stat's fields (user, system, irq, softirq: the whole
guest) and (2) by task group, each user+system: fio, squeeze's threads by
name (digits dropped: the queue threads, the ublk workers, the FUSE
threads, the flushers), the kernel's threads (kworkers by workqueue,
ksoftirqd, ...), fio (from its own report: it exits before the second
snapshot) and the rest ("other bash" is mostly the snapshots themselves,
which fall outside the window the busy figures count); then context switches and IPIs per request
(a request: the job's block size, 128 KiB or 4 KiB).
"""
import json
import os
import re
import sys
from collections import defaultdict

d = sys.argv[1]


def snap(path):
    tasks, cpu, counts = {}, [], {}
    for line in open(path):
        f = line.split()
        if not f:
            continue
        if f[0] == "task" and len(f) >= 6:
            tasks[(f[1], f[2])] = (f[3], int(f[4]), int(f[5]))
        elif f[0] == "cpu":
            cpu = [int(x) for x in f[1:]]
        elif f[0] in ("ctxt", "intr"):
            counts[f[0]] = int(f[1])
        elif f[0] == "irq":
            n = 0
            for x in f[2:]:
                if not x.isdigit():
                    break
                n += int(x)
            counts[f[1]] = n
    return tasks, cpu, counts


def group(comm, pid, server_pids):
    c = re.sub(r"[-_]?[0-9]+$", "", comm)
    if comm.startswith("kworker/"):
        wq = comm.split("-", 1)[1] if "-" in comm else "idle"
        wq = re.sub(r"[-:0-9]+$", "", wq)
        return "k:kworker " + wq
    if comm.startswith("ksoftirqd"):
        return "k:ksoftirqd"
    if pid in server_pids:
        return "squeeze " + c
    if comm == "fio":
        return "fio"
    if pid == "2" or comm.startswith(("kthreadd", "rcu", "migration", "cpuhp", "idle_inject")):
        return "k:other"
    return "other " + c


rows = []
for line in open(os.path.join(d, "results.tsv")):
    rep, path, job, busy, server, hz, moved = line.split()
    a = os.path.join(d, f"{rep}-{path}-{job}.tasks0")
    b = os.path.join(d, f"{rep}-{path}-{job}.tasks1")
    if not (os.path.exists(a) and os.path.exists(b)) or int(moved) == 0:
        continue
    t0, c0, n0 = snap(a)
    t1, c1, n1 = snap(b)
    hz, gib = int(hz), int(moved) / 2**30
    bs = 128 << 10 if "128k" in job else 4 << 10
    reqs = int(moved) / bs
    server_pids = {pid for (pid, tid), (comm, _, _) in t1.items() if comm.startswith(("squeeze", "sqz"))}
    groups = defaultdict(lambda: [0, 0])
    for k, (comm, u1, s1) in t1.items():
        _, u0, s0 = t0.get(k, (comm, 0, 0))
        if u1 - u0 or s1 - s0:
            g = groups[group(comm, k[0], server_pids)]
            g[0] += u1 - u0
            g[1] += s1 - s0
    dc = [y - x for x, y in zip(c0, c1)]
    names = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]
    stat = {n: dc[i] / hz / gib for i, n in enumerate(names) if i < len(dc)}
    # fio exits before the second snapshot: its CPU from its own report
    # (usr_cpu and sys_cpu, percent of its run time), per GiB it moved.
    try:
        t = open(os.path.join(d, f"{rep}-{path}-{job}.json")).read()
        fj = json.JSONDecoder().raw_decode(t[t.index("{"):])[0]["jobs"][0]
        fio_gib = (fj["read"]["io_bytes"] + fj["write"]["io_bytes"]) / 2**30
        run_s = fj["job_runtime"] / 1000
        for k, field in ((0, "usr_cpu"), (1, "sys_cpu")):
            groups["fio (its report)"][k] = fj[field] / 100 * run_s * hz * gib / fio_gib
    except (OSError, ValueError, KeyError, ZeroDivisionError):
        pass
    rows.append((rep, path, job, gib, reqs, hz, stat, groups,
                 {k: n1.get(k, 0) - n0.get(k, 0) for k in n1}))

print("| rep | path | job | GiB | guest user | system | irq | softirq | busy | ctxt/req | IPI (RES+CAL)/req |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for rep, path, job, gib, reqs, hz, st, groups, n in rows:
    busy = st["user"] + st["nice"] + st["system"] + st.get("irq", 0) + st.get("softirq", 0)
    print(f"| {rep} | {path} | {job} | {gib:.2f} | {st['user']:.1f} | {st['system']:.1f} | "
          f"{st.get('irq', 0):.1f} | {st.get('softirq', 0):.1f} | {busy:.1f} | "
          f"{n.get('ctxt', 0) / reqs:.1f} | {(n.get('RES', 0) + n.get('CAL', 0)) / reqs:.2f} |")
print()
for rep, path, job, gib, reqs, hz, st, groups, n in rows:
    # The snapshots span a little more than the job's window (and their own
    # bash): each group's share of the tasks' CPU (the snapshots' bash
    # left out), times the window's busy CPU per GiB less fio's.
    busy = st["user"] + st["nice"] + st["system"] + st.get("irq", 0) + st.get("softirq", 0)
    fio = sum(groups.pop("fio (its report)", [0, 0])) / hz / gib
    groups.pop("other bash", None)
    total = sum(u + s for u, s in groups.values()) or 1
    rest = max(busy - fio, 0)
    print(f"### {rep} {path} {job}: where the guest's {busy:.0f} CPU s/GiB went")
    print()
    print("| group | share of the tasks' CPU | system part | CPU s/GiB |")
    print("|---|---:|---:|---:|")
    print(f"| fio (its report) | | | {fio:.1f} |")
    for g, (u, s) in sorted(groups.items(), key=lambda kv: -(kv[1][0] + kv[1][1])):
        share = (u + s) / total
        if share < 0.01:
            continue
        print(f"| {g} | {100 * share:.0f}% | {100 * s / max(u + s, 1):.0f}% | {share * rest:.1f} |")
    print()
