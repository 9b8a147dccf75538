#!/usr/bin/env python3
"""bench/results.py: OUT/results.jsonl and OUT/table.md of the bench/ harnesses (Python 3,
standard library only; bench/lib.sh's sq_result, sq_emit and sq_table call it).

  results.py add FILE KEY=VALUE...         append one JSON object to FILE
  results.py add FILE - [KEY=VALUE...]     append the JSON objects on stdin (one a line, blank
                                           lines skipped), each with KEY=VALUE set (first)
  results.py from-csv CSV [KEY=VALUE...]   a CSV file with a header -> JSON lines on stdout
  results.py from-json FILE [KEY=VALUE...] a JSON document (an object, or a list of objects)
                                           -> JSON lines on stdout
  results.py table FILE                    FILE's objects -> markdown on stdout: one table for
                                           each set of keys, in the order first seen

KEY=VALUE: VALUE is a JSON number when it reads as one (12, -3, 0.875, 1e9; not 012 or nan),
else a string; KEY:=JSON takes any JSON value (true, null, [1, 2], {"a": 1}). CSV cells are
read the same way, an empty cell as null. NaN and infinities become null (JSON has neither).
Nothing is rounded in results.jsonl; the table shows floats with at most 3 decimals (3
significant digits below 0.001).
"""
import csv
import json
import re
import sys

NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")


def value(text):
    """A cell or VALUE: a number if it reads as one, else the string."""
    if NUMBER.fullmatch(text):
        if re.fullmatch(r"-?[0-9]+", text):
            return int(text)
        return float(text)
    return text


def pairs(args):
    """KEY=VALUE and KEY:=JSON arguments -> dict, in order."""
    out = {}
    for a in args:
        raw = False
        if ":=" in a and ("=" not in a or a.index(":=") < a.index("=")):
            key, text = a.split(":=", 1)
            raw = True
        elif "=" in a:
            key, text = a.split("=", 1)
        else:
            raise ValueError(f"{a!r} is not KEY=VALUE or KEY:=JSON")
        if not key:
            raise ValueError(f"{a!r} has no key")
        if raw:
            try:
                out[key] = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{a!r}: not JSON ({e})") from None
        else:
            out[key] = value(text)
    return out


def objects(lines, extra=None):
    """JSON lines -> dicts (extra keys first); ValueError naming the line that is not an object."""
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"line {n} is not JSON ({e}): {line.strip()[:80]}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"line {n} is not a JSON object: {line.strip()[:80]}")
        out.append({**(extra or {}), **obj})
    return out


def finite(v):
    """NaN and infinities (which JSON has not) -> null, in nested values too."""
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [finite(x) for x in v]
    return v


def dumps(obj):
    return json.dumps(finite(obj), allow_nan=False)


def add(path, args, stdin):
    if args and args[0] == "-":
        new = objects(stdin, pairs(args[1:]))
    else:
        if not args:
            raise ValueError("nothing to add (KEY=VALUE..., or - for JSON lines on stdin)")
        new = [pairs(args)]
    text = "".join(dumps(o) + "\n" for o in new)
    with open(path, "a") as f:
        f.write(text)


def from_csv(path, args):
    extra = pairs(args)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            obj = dict(extra)
            for k, v in row.items():
                if k is None:  # more cells than the header names
                    continue
                obj[k] = None if v in ("", None) else value(v)
            print(dumps(obj))


def from_json(path, args):
    extra = pairs(args)
    with open(path) as f:
        doc = json.load(f)
    for obj in doc if isinstance(doc, list) else [doc]:
        if not isinstance(obj, dict):
            raise ValueError(f"{path}: not an object or a list of objects")
        print(dumps({**extra, **obj}))


def cell(v):
    if v is None:
        s = ""
    elif isinstance(v, bool):
        s = "true" if v else "false"
    elif isinstance(v, int):
        s = str(v)
    elif isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            s = str(v)
        elif v != 0 and abs(v) < 0.001:
            s = f"{v:.3g}"
        else:
            s = f"{v:.3f}".rstrip("0").rstrip(".")
    elif isinstance(v, str):
        s = v
    else:
        s = json.dumps(v, separators=(",", ":"))
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def table(rows):
    """Markdown: one table per set of keys (first-seen order); numeric columns right-aligned."""
    if not rows:
        return "_no results_\n"
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r), []).append(r)
    parts = []
    for keys, rs in groups.items():
        numeric = [
            all(isinstance(r[k], (int, float)) and not isinstance(r[k], bool) for r in rs if r[k] is not None)
            and any(r[k] is not None for r in rs)
            for k in keys
        ]
        lines = ["| " + " | ".join(cell(k) for k in keys) + " |",
                 "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
        lines += ["| " + " | ".join(cell(r[k]) for k in keys) + " |" for r in rs]
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def main(argv):
    usage = __doc__.split("\n\n")[1]
    if len(argv) < 3:
        sys.exit("usage:\n" + usage)
    cmd, path, args = argv[1], argv[2], argv[3:]
    try:
        if cmd == "add":
            add(path, args, sys.stdin)
        elif cmd == "from-csv":
            from_csv(path, args)
        elif cmd == "from-json":
            from_json(path, args)
        elif cmd == "table" and not args:
            try:
                with open(path) as f:
                    rows = objects(f)
            except FileNotFoundError:
                rows = []
            sys.stdout.write(table(rows))
        else:
            sys.exit("usage:\n" + usage)
    except (OSError, ValueError) as e:
        sys.exit(f"results.py {cmd}: {e}")


if __name__ == "__main__":
    main(sys.argv)
