#!/usr/bin/env python3
"""What a second page costs one fdatasync on this disk: the floor under the
flush marks' cost (bench/flush_cost.sh, docs/benchmarks.md "Flush path").

A commit loop like a WAL's: write 4 KiB at the log's next page, fdatasync,
then, per case, write a 72-byte flush mark to one of sixteen other pages:

  one_page        no mark: what one commit costs the disk (the yardstick);
  mark_started    the mark through the page cache, its writeback started at
                  once with sync_file_range(WRITE) (what squeeze does, from
                  a thread of the file storage);
  mark_dirty      the mark left dirty, so the next fdatasync writes it;
  mark_direct     the mark written with O_DIRECT, synchronously.

Prints one JSON line per case and round: {"case", "round", "p50_us",
"p99_us"}. No case depends on squeeze; only on the file system and the disk
under --dir.

Usage: bench/fdatasync_pages.py [--dir DIR] [--commits N] [--rounds R]
"""
import argparse
import ctypes
import json
import mmap
import os
import time

SYNC_FILE_RANGE_WRITE = 2
LOG_START = 1 << 20
LOG_PAGES = 8000
MARK_START = 8192
MARK_SLOTS = 16


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=".")
    ap.add_argument("--commits", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if a.commits < 100 or a.rounds < 1:
        ap.error("--commits must be at least 100 and --rounds at least 1")
    if not os.path.isdir(a.dir):
        ap.error(f"--dir {a.dir}: not a directory")
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    path = os.path.join(a.dir, f"fdatasync_pages.{os.getpid()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        dfd = os.open(path, os.O_RDWR | os.O_DIRECT)
    except OSError:
        dfd = None  # file systems without O_DIRECT (tmpfs): case skipped
    try:
        os.ftruncate(fd, LOG_START + LOG_PAGES * 4096)
        os.fsync(fd)
        page = b"l" * 4096
        mark = b"m" * 72
        aligned = mmap.mmap(-1, 4096)
        aligned.write(b"m" * 4096)

        def run(case):
            lat = []
            for i in range(a.commits):
                t = time.perf_counter()
                os.pwrite(fd, page, LOG_START + (i % LOG_PAGES) * 4096)
                os.fdatasync(fd)
                off = MARK_START + (i % MARK_SLOTS) * 4096
                if case == "mark_started":
                    os.pwrite(fd, mark, off)
                    libc.sync_file_range(fd, ctypes.c_longlong(off), ctypes.c_longlong(4096), SYNC_FILE_RANGE_WRITE)
                elif case == "mark_dirty":
                    os.pwrite(fd, mark, off)
                elif case == "mark_direct":
                    os.pwritev(dfd, [aligned], off)
                lat.append(time.perf_counter() - t)
            lat.sort()
            return lat[len(lat) // 2] * 1e6, lat[len(lat) * 99 // 100] * 1e6

        cases = ["one_page", "mark_started", "mark_dirty"] + (["mark_direct"] if dfd is not None else [])
        for r in range(a.rounds):
            for case in cases:
                p50, p99 = run(case)
                print(json.dumps({"case": case, "round": r + 1, "p50_us": round(p50, 1), "p99_us": round(p99, 1)}), flush=True)
    finally:
        os.close(fd)
        if dfd is not None:
            os.close(dfd)
        os.unlink(path)


if __name__ == "__main__":
    main()
