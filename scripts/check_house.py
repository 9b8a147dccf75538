#!/usr/bin/env python3
"""The house rules the compiler does not keep, checked on every test run
(scripts/test.sh) so that a split is not undone by the next feature:

1. The engine's module graph has no cycle. A node is a source file of
   crates/squeeze-engine/src (a directory's mod.rs stands for the module
   itself); an edge F -> G means F names an item that lives in G
   (`crate::a::b::Item`, `super::Item`, `self::x::Item`, in `use` lines or
   inline paths). A `pub use` re-export is followed to the file that defines
   the item, so re-exporting from a parent is not a dependency of it.
2. No tracked source file (Rust, Python, shell) is over 800 lines unless
   its header (first 40 lines) says why, in a line containing "Over 800
   lines".
3. No subcommand imports another: a file under src/cmd/NAME/ (or
   src/cmd/NAME.rs) never names `crate::cmd::OTHER` (what two share moves
   below both, into src/).

Usage: scripts/check_house.py [--graph]   (--graph prints the engine's
edges, one "from -> to" a line, for docs and reviews). Exits 1 and names
every breach otherwise.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = os.path.join(ROOT, "crates", "squeeze-engine", "src")
MAX_LINES = 800

# A path as written in Rust: segments joined by ::, possibly ending in a
# {group}. Groups are expanded by `expand`.
PATH_START = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)(::\{)?")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(re.sub(r"//.*", "", line) for line in text.split("\n"))


def strip_tests(text):
    """Drops `#[cfg(test)] mod ... { ... }` blocks: tests may use anything."""
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([a-z]+\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def group_body(text, start):
    """The text of a {group} whose opening brace is at text[start - 1]."""
    depth, j = 1, start
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[start : j - 1]


def expand(prefix, body):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (prefix given)."""
    paths, i, cur = [], 0, ""
    while i < len(body):
        ch = body[i]
        if ch == "{":
            inner = group_body(body, i + 1)
            paths += expand(prefix + cur.strip().rstrip(":").rstrip(":") + "::" if cur.strip() else prefix, inner)
            i += len(inner) + 2
            cur = ""
            continue
        if ch == ",":
            if cur.strip():
                paths.append(prefix + cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    if cur.strip():
        paths.append(prefix + cur.strip())
    return [re.sub(r"\s+as\s+\w+$", "", p).strip() for p in paths]


class Engine:
    def __init__(self, root):
        self.root = root
        self.files = {}  # module path tuple -> file path
        for dirpath, _, names in os.walk(root):
            for n in names:
                if not n.endswith(".rs"):
                    continue
                full = os.path.join(dirpath, n)
                rel = os.path.relpath(full, root)[:-3].split(os.sep)
                if rel[-1] in ("mod", "lib", "main"):
                    rel = rel[:-1]
                self.files[tuple(rel)] = full
        self.texts = {m: strip_tests(strip_comments(open(f).read())) for m, f in self.files.items()}
        self.reexports = {m: self._reexports(m) for m in self.files}

    def _reexports(self, mod):
        """item name -> absolute path it re-exports, for `pub use` lines."""
        out = {}
        for m in re.finditer(r"pub(?:\([a-z]+\))?\s+use\s+([^;]+);", self.texts[mod]):
            for p in self._paths_in(mod, m.group(1)):
                out[p[-1]] = p
        return out

    def _absolute(self, mod, segs):
        head, rest = segs[0], list(segs[1:])
        if head == "crate":
            base = []
        elif head == "self":
            base = list(mod)
        else:  # super (possibly repeated)
            base = list(mod)
            while head == "super":
                base = base[:-1]
                if rest and rest[0] == "super":
                    rest.pop(0)
                    continue
                break
        return tuple(base + rest)

    def _paths_in(self, mod, text):
        paths = []
        for m in PATH_START.finditer(text):
            head = m.group(1)
            segs = [head] + [s for s in m.group(2).split("::") if s]
            if m.group(3):
                body = group_body(text, m.end())
                for p in expand("", body):
                    more = [s for s in p.split("::") if s and s != "self"]
                    paths.append(self._absolute(mod, segs + more))
            else:
                paths.append(self._absolute(mod, segs))
        # a bare `use foo::...` of a child module declared here
        return paths

    def resolve(self, path, seen=None):
        """The file (module tuple) that defines the item at `path`."""
        seen = seen or set()
        for n in range(len(path), -1, -1):
            mod = path[:n]
            if mod in self.files:
                item = path[n] if n < len(path) else None
                if item and item in self.reexports.get(mod, {}) and (mod, item) not in seen:
                    seen.add((mod, item))
                    return self.resolve(self.reexports[mod][item] + path[n + 1 :], seen)
                return mod
        return None

    def edges(self):
        out = set()
        for mod, text in self.texts.items():
            for p in self._paths_in(mod, text):
                target = self.resolve(p)
                if target is None or target == mod or target == ():
                    continue
                # A module naming its own child's item through a path is a
                # real edge; a child naming its parent's is too.
                out.add((mod, target))
        return out


def cycles(edges):
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            strong(v)
    return sccs


def name(mod):
    return "/".join(mod) or "lib"


def source_files():
    """The tracked Rust, Python and shell sources (every file below the
    root when this is not a git checkout)."""
    exts = (".rs", ".py", ".sh")
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, check=True).stdout
        names = [n for n in out.decode().split("\0") if n.endswith(exts)]
        return [os.path.join(ROOT, n) for n in names if os.path.isfile(os.path.join(ROOT, n))]
    except (OSError, subprocess.CalledProcessError):
        found = []
        for dirpath, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in ("target", ".git")]
            found += [os.path.join(dirpath, n) for n in names if n.endswith(exts)]
        return found


def long_files():
    bad = []
    for full in sorted(source_files()):
        lines = open(full, errors="replace").read().split("\n")
        count = len(lines) - (1 if lines and lines[-1] == "" else 0)
        if count > MAX_LINES and not any("Over 800 lines" in line for line in lines[:40]):
            bad.append(f"{os.path.relpath(full, ROOT)}: {count} lines and no 'Over 800 lines' reason in its header")
    return bad


def subcommand_imports():
    bad = []
    cmd = os.path.join(ROOT, "src", "cmd")
    if not os.path.isdir(cmd):
        return bad
    for dirpath, _, names in os.walk(cmd):
        for n in names:
            if not n.endswith(".rs") or (dirpath == cmd and n == "mod.rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, n), cmd)
            own = rel.split(os.sep)[0].removesuffix(".rs")
            text = strip_comments(open(os.path.join(dirpath, n)).read())
            for m in re.finditer(r"crate::cmd::(\w+)", text):
                if m.group(1) != own:
                    bad.append(f"src/cmd/{rel}: imports the subcommand `{m.group(1)}` (move what they share below both)")
            for m in re.finditer(r"crate::cmd::\{([^}]*)\}", text):
                for other in re.findall(r"\b(\w+)", m.group(1)):
                    if other != own:
                        bad.append(f"src/cmd/{rel}: imports the subcommand `{other}`")
    return bad


def main():
    engine = Engine(ENGINE)
    edges = engine.edges()
    if "--graph" in sys.argv:
        for a, b in sorted(edges):
            print(f"{name(a)} -> {name(b)}")
        return 0
    problems = []
    for comp in cycles(edges):
        inner = sorted((a, b) for a, b in edges if a in comp and b in comp)
        problems.append(
            "engine import cycle among " + ", ".join(name(m) for m in comp) + ": "
            + "; ".join(f"{name(a)} -> {name(b)}" for a, b in inner)
        )
    problems += long_files()
    problems += subcommand_imports()
    for p in problems:
        print("HOUSE:", p)
    if problems:
        print(f"check_house: {len(problems)} problem(s)")
        return 1
    print(f"check_house: ok (engine: {len(engine.files)} files, {len(edges)} edges, no cycle; "
          f"no file over {MAX_LINES} lines without a reason; no subcommand imports another)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
