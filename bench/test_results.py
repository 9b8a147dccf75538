#!/usr/bin/env python3
"""Tests of bench/results.py (results.jsonl and table.md of every bench/ harness), and of the
bench/lib.sh functions that call it (sq_out, sq_result, sq_emit, sq_table) and of sq_lock on a
private lock file: no squeeze binary, no root, no /tmp/bench.lock.

  python3 bench/test_results.py
"""
import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no bench/__pycache__ in the tree
import results  # noqa: E402

LIB = os.path.join(HERE, "lib.sh")


class Values(unittest.TestCase):
    def test_numbers_are_numbers_and_the_rest_strings(self):
        self.assertEqual(results.value("12"), 12)
        self.assertEqual(results.value("-3"), -3)
        self.assertEqual(results.value("0.875"), 0.875)
        self.assertEqual(results.value("1e9"), 1e9)
        for s in ("012", "nan", "inf", "923397d", "1.2.3", "", " 1", "12 MB/s", "0x10"):
            self.assertEqual(results.value(s), s, s)

    def test_pairs_keep_their_order_and_take_raw_json_after_colon_equals(self):
        p = results.pairs(["b=1", "a=x=y", "ok:=true", "l:=[1, 2]", "n:=null", "MB/s=3.5"])
        self.assertEqual(list(p), ["b", "a", "ok", "l", "n", "MB/s"])
        self.assertEqual(p, {"b": 1, "a": "x=y", "ok": True, "l": [1, 2], "n": None, "MB/s": 3.5})
        for bad in (["novalue"], ["=1"], ["x:=nojson"]):
            with self.assertRaises(ValueError):
                results.pairs(bad)


class AddAndConvert(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.file = os.path.join(self.dir, "results.jsonl")

    def lines(self):
        with open(self.file) as f:
            return [json.loads(line) for line in f]

    def test_add_appends_one_object_per_call_and_stdin_lines_with_extra_keys_first(self):
        results.add(self.file, ["case=a", "value=1.5"], io.StringIO())
        results.add(self.file, ["-", "store=kv"], io.StringIO('{"phase": "load", "ops": 7}\n\n{"phase": "a", "store": "own"}\n'))
        rows = self.lines()
        self.assertEqual(rows[0], {"case": "a", "value": 1.5})
        self.assertEqual(rows[1], {"store": "kv", "phase": "load", "ops": 7})
        self.assertEqual(list(rows[1]), ["store", "phase", "ops"])
        self.assertEqual(rows[2], {"store": "own", "phase": "a"})  # the line's own value wins

    def test_add_refuses_what_is_not_one_json_object_a_line_and_writes_nothing(self):
        for bad in ('{"a": 1}\nnot json\n', '[1, 2]\n', '{"a": 1,\n"b": 2}\n'):
            with self.assertRaises(ValueError):
                results.add(self.file, ["-"], io.StringIO(bad))
        self.assertFalse(os.path.exists(self.file) and os.path.getsize(self.file))

    def test_non_finite_floats_become_null(self):
        results.add(self.file, ["-"], io.StringIO('{"a": NaN, "b": [Infinity, 1.0], "c": {"d": -Infinity}}\n'))
        self.assertEqual(self.lines(), [{"a": None, "b": [None, 1.0], "c": {"d": None}}])

    def test_csv_rows_become_typed_objects(self):
        path = os.path.join(self.dir, "r.csv")
        with open(path, "w") as f:
            f.write("rep,peer,MBps,ratio,note\n1,nbd-raw,382.4,1.00,\n1,custom,1026,2.46,page cache\n")
        buf = io.StringIO()
        with redirect_stdout(buf):
            results.from_csv(path, ["pass=peers"])
        rows = [json.loads(line) for line in buf.getvalue().splitlines()]
        self.assertEqual(rows[0], {"pass": "peers", "rep": 1, "peer": "nbd-raw", "MBps": 382.4, "ratio": 1.0, "note": None})
        self.assertEqual(rows[1]["note"], "page cache")

    def test_the_report_fixtures_csv_converts_whole(self):
        path = os.path.join(HERE, "testdata", "report", "peers", "results.csv")
        buf = io.StringIO()
        with redirect_stdout(buf):
            results.from_csv(path, ["pass=peers"])
        rows = [json.loads(line) for line in buf.getvalue().splitlines()]
        with open(path) as f:
            self.assertEqual(len(rows), len(f.readlines()) - 1)
        self.assertTrue(all(r["pass"] == "peers" and isinstance(r["rep"], int) for r in rows))

    def test_json_documents_become_lines(self):
        path = os.path.join(self.dir, "d.json")
        with open(path, "w") as f:
            json.dump([{"threads": 1, "p50": 2.5}, {"threads": 8, "p50": 9}], f, indent=2)
        buf = io.StringIO()
        with redirect_stdout(buf):
            results.from_json(path, ["build=after"])
        self.assertEqual([json.loads(x) for x in buf.getvalue().splitlines()],
                         [{"build": "after", "threads": 1, "p50": 2.5}, {"build": "after", "threads": 8, "p50": 9}])


class Table(unittest.TestCase):
    def test_one_table_per_set_of_keys_numbers_right_aligned(self):
        rows = [
            {"peer": "raw", "rep": 1, "MB/s": 631.0},
            {"peer": "squeeze", "rep": 1, "MB/s": 640.123456},
            {"peer": "squeeze", "rep": 1, "settle_s": 5, "ratio": 2.5},
            {"peer": "raw", "rep": 2, "MB/s": None},
        ]
        md = results.table(rows)
        self.assertEqual(md, textwrap.dedent("""\
            | peer | rep | MB/s |
            |---|---:|---:|
            | raw | 1 | 631 |
            | squeeze | 1 | 640.123 |
            | raw | 2 |  |

            | peer | rep | settle_s | ratio |
            |---|---:|---:|---:|
            | squeeze | 1 | 5 | 2.5 |
            """))

    def test_cells(self):
        self.assertEqual(results.cell(0.000123456), "0.000123")
        self.assertEqual(results.cell(0.0), "0")
        self.assertEqual(results.cell(True), "true")
        self.assertEqual(results.cell("a|b\nc"), "a\\|b c")
        self.assertEqual(results.cell({"zstd:3": 1}), '{"zstd:3":1}')

    def test_no_results(self):
        self.assertEqual(results.table([]), "_no results_\n")


def bash(script, env=None, cwd=None):
    """Run SCRIPT (after sourcing lib.sh, as a harness does) -> CompletedProcess."""
    full = f"set -euo pipefail\nSQ_PROG=test\n. {LIB}\n{script}\n"
    e = {k: v for k, v in os.environ.items() if k not in ("SQ_LOCKED", "OUT", "BIN")}
    e.update(env or {})
    return subprocess.run(["bash", "-c", full], env=e, cwd=cwd, capture_output=True, text=True, timeout=60)


class Lib(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.lock = os.path.join(self.dir, "bench.lock")
        self.env = {"BENCH_LOCK": self.lock, "SQ_RESULTS": os.path.join(self.dir, "results")}

    def test_out_result_emit_and_table(self):
        p = bash(textwrap.dedent("""\
            sq_out demo
            sq_result case=a value=1
            printf '%s\\n' 'a human line' '{"case": "b", "value": 2.5}' | sq_emit rep=1
            sq_table
            echo "OUT=$OUT"
            """), self.env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("a human line\n", p.stdout)
        self.assertNotIn('"case"', p.stdout)
        out = p.stdout.split("OUT=")[1].strip()
        self.assertTrue(out.startswith(os.path.join(self.dir, "results", "demo-")), out)
        with open(os.path.join(out, "results.jsonl")) as f:
            self.assertEqual([json.loads(x) for x in f], [{"case": "a", "value": 1}, {"rep": 1, "case": "b", "value": 2.5}])
        with open(os.path.join(out, "table.md")) as f:
            self.assertIn("| case | value |", f.read())
        with open(os.path.join(out, "machine.txt")) as f:
            self.assertIn("cores: ", f.read())

    def test_a_run_that_dies_leaves_a_table_of_what_it_wrote(self):
        out = os.path.join(self.dir, "given")
        p = bash("sq_out demo\nsq_result step=1 ok:=true\nsq_die 'on purpose'", dict(self.env, OUT=out))
        self.assertEqual(p.returncode, 1)
        with open(os.path.join(out, "table.md")) as f:
            t = f.read()
        self.assertIn("ended early (exit status 1)", t)
        self.assertIn("| 1 | true |", t)

    def test_sq_table_dash_copies_stdin_to_table_md_and_stdout(self):
        out = os.path.join(self.dir, "o")
        p = bash("sq_out demo\nprintf '| a |\\n' | sq_table -", dict(self.env, OUT=out))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "| a |\n")
        with open(os.path.join(out, "table.md")) as f:
            self.assertEqual(f.read(), "| a |\n")

    def test_exit_hooks_run_last_registered_first(self):
        p = bash("a() { echo a; }\nb() { echo b; }\nsq_on_exit a\nsq_on_exit b\nexit 3", self.env)
        self.assertEqual((p.returncode, p.stdout), (3, "b\na\n"))

    def test_lock_is_taken_and_a_child_with_sq_locked_does_not_wait(self):
        # The child would wait for ever if it took the lock again; timeout 20 s says it did not.
        p = bash(textwrap.dedent(f"""\
            sq_lock
            [[ $SQ_LOCKED == 1 ]]
            flock -n {self.lock} true && echo "NOT HELD"
            timeout 20 bash -c 'set -e; SQ_PROG=child; . {LIB}; sq_lock; echo child-ran'
            """), self.env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "child-ran\n")
        self.assertIn("held by the caller", p.stderr)

    def test_a_harness_run_under_flock_of_the_same_file_does_not_wait(self):
        script = f"set -e; SQ_PROG=under-flock; . {LIB}; sq_lock; echo ran"
        e = dict(os.environ, BENCH_LOCK=self.lock)
        e.pop("SQ_LOCKED", None)
        p = subprocess.run(["timeout", "20", "flock", self.lock, "bash", "-c", script],
                           env=e, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "ran\n")

    def test_a_held_lock_is_waited_for_with_a_message_naming_the_holder(self):
        holder = subprocess.Popen(["flock", self.lock, "sleep", "2"])
        try:
            p = bash("sleep 0.3\nsq_lock\necho got", self.env)
        finally:
            holder.wait()
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "got\n")
        self.assertRegex(p.stderr, r"waiting for .*bench\.lock \(held by pid [0-9]+: flock ")
        self.assertIn("holding", p.stderr)

    def test_sq_locked_without_a_holder_takes_the_lock(self):
        p = bash("SQ_LOCKED=1\nsq_lock\nflock -n \"$SQ_LOCK\" true || echo held", self.env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "held\n")
        self.assertIn("nobody held", p.stderr)


FAKE_SERVE = """#!/bin/bash
# a stand-in for `squeeze serve`: up after 0.3 s (or FAIL: exits at once), SIGTERM ends it
[[ $1 == serve ]] || exit 2
[[ -z ${FAIL:-} ]] || { echo "squeeze serve: no such volume" >&2; exit 1; }
trap 'echo "squeeze serve: signal 15, finishing" >&2; exit 0' TERM
sleep 0.3
echo "squeeze serve: listening on unix:${3:-?}" >&2
ls -l /proc/$$/fd/ >"${LSFD:-/dev/null}"
while :; do sleep 0.05; done
"""


class Serve(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.bin = os.path.join(self.dir, "squeeze")
        with open(self.bin, "w") as f:
            f.write(FAKE_SERVE)
        os.chmod(self.bin, 0o755)
        self.lock = os.path.join(self.dir, "bench.lock")
        self.env = {"BENCH_LOCK": self.lock, "SQ_RESULTS": os.path.join(self.dir, "results")}

    def run_lib(self, script, **env):
        return bash(f"BIN={self.bin}\n{script}", dict(self.env, **env))

    def test_start_waits_for_listening_and_stop_sends_sigterm_and_waits(self):
        log = os.path.join(self.dir, "serve.log")
        lsfd = os.path.join(self.dir, "fd.txt")
        p = self.run_lib(textwrap.dedent(f"""\
            sq_lock
            sq_serve_start one {log} -- --socket {self.dir}/nbd.sock vol.sqz
            grep -q 'listening on' {log} && echo up
            pid=$(sq_serve_pid one)
            kill -0 "$pid" && echo running
            sq_serve_stop one
            echo "rc=$SQ_SERVE_RC"
            kill -0 "$pid" 2>/dev/null || echo gone
            [[ -z $(sq_serve_pid one) ]] && echo forgotten
            """), LSFD=lsfd)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "up\nrunning\nrc=0\ngone\nforgotten\n")
        with open(log) as f:
            self.assertIn("signal 15", f.read())
        with open(lsfd) as f:
            self.assertNotIn(self.lock, f.read())  # the server does not hold the bench lock

    def test_a_restart_appends_to_the_log_and_waits_for_its_own_listening_line(self):
        log = os.path.join(self.dir, "serve.log")
        p = self.run_lib(textwrap.dedent(f"""\
            sq_serve_start one {log} -- --socket a
            sq_serve_stop one
            t0=$EPOCHREALTIME
            sq_serve_start one {log} -- --socket b
            python3 -c "import sys; print('waited' if float(sys.argv[2]) - float(sys.argv[1]) > 0.25 else 'did not wait')" "$t0" "$EPOCHREALTIME"
            """))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "waited\n")
        with open(log) as f:
            self.assertEqual(f.read().count("listening on"), 2)

    def test_ready_paths_are_waited_for(self):
        log = os.path.join(self.dir, "serve.log")
        path = os.path.join(self.dir, "appears")
        p = self.run_lib(textwrap.dedent(f"""\
            (sleep 1; touch {path}) &
            sq_serve_start one {log} --ready {path} -- x
            [[ -e {path} ]] && echo ready
            """))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "ready\n")

    def test_a_server_that_exits_first_is_an_error_with_its_log(self):
        p = self.run_lib(f"sq_serve_start one {self.dir}/serve.log -- x\necho not-reached", FAIL="1")
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stdout, "")
        self.assertRegex(p.stderr, r"exited \(status 1\) before it was up: squeeze serve: no such volume")

    def test_servers_still_running_at_exit_are_stopped_after_the_hooks(self):
        p = self.run_lib(textwrap.dedent(f"""\
            hook() {{ kill -0 "$(sq_serve_pid one)" && echo "hook: server still up"; }}
            sq_on_exit hook
            sq_serve_start one {self.dir}/one.log -- x
            sq_serve_start two {self.dir}/two.log -- x
            echo "$(sq_serve_pid one) $(sq_serve_pid two)" >{self.dir}/pids
            sq_die "on purpose"
            """))
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stdout, "hook: server still up\n")
        with open(os.path.join(self.dir, "pids")) as f:
            pids = [int(x) for x in f.read().split()]
        for pid in pids:
            with self.assertRaises(ProcessLookupError):
                os.kill(pid, 0)
        for name in ("one", "two"):
            with open(os.path.join(self.dir, f"{name}.log")) as f:
                self.assertIn("signal 15", f.read())


if __name__ == "__main__":
    unittest.main(verbosity=1)
