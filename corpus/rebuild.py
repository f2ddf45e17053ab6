"""Rebuild the committed-file cases of the real-log corpus from local git mirrors, and check them.

    python corpus/rebuild.py MIRRORS OUT [--manifest corpus/real-cases.yaml] [--only ID,...] [--search]

The logs are third-party text and are never committed (corpus/README.md, "Keeping the copy"); a case with
a `commit` names a file in a public repository, so its copy can be made again from that repository.
MIRRORS holds one git repository per source, named `OWNER+REPO` (bare, a clone, or a folder with the git
directory in `repo/`, as the fetch tool leaves it); nothing is fetched here. Each case becomes
`OUT/<set letters, lowercased>/<ID>/` with its files and a `truth.yaml`, and every file is checked against
the manifest's `digests`: a summary goes to stdout and a JSON report to OUT/rebuild-report.json.

How a file is made is its case's `extract` entry in the manifest (file name -> recipe), else the default:
the file at source_url (its section under the #anchor heading for a .md), or, for a second file, the file
of that name beside it. A recipe is a dict with an optional `path` (default: source_url's path) and at most
one of
    section: "## heading line"      the heading line and what follows it up to the next heading of its level
                                    or higher (a logbook entry)
    lines: [A, B]                   lines A..B, 1-based and inclusive (an excerpt inside a file)
    head: N, tail: M                the first N and last M lines around one line CUT (a long file)
    (and section + head/tail or lines + head/tail: the cut applied to that part)
Where the default does not give the digest, `--search` tries the other recipes (whole files, every section,
every cut and line range whose size is right, files beside it) and, with `--record`, writes the recipes it
found into the manifest so the next rebuild needs no search.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import posixpath
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from faultline.evaluate import split_of  # noqa: E402

# The label fields a case's truth.yaml carries (build_manifest.FIELDS: the same, so a rebuilt folder
# rewrites the same manifest).
FIELDS = ("source_url", "commit", "title", "ecosystem", "outcome_category", "culprit", "confidence_of_label",
          "multi_node", "state", "root_cause", "notes")
CUT = b"[... cut ...]\n"
HEADING = re.compile(rb"^(#{1,6})[ \t]")
URL = re.compile(r"https://github\.com/([^/]+)/([^/]+)/blob/([0-9a-f]{40})/([^#]+)(?:#(.*))?$")


# ---- the source ------------------------------------------------------------------------------------

def parse_url(url: str) -> dict | None:
    m = URL.match(url.strip())
    if not m:
        return None
    owner, repo, commit, path, anchor = m.groups()
    return {"repo": f"{owner}+{repo}", "commit": commit, "path": unquote(path), "anchor": anchor}


def git_dir(mirrors: Path, name: str) -> Path | None:
    """The git directory of mirror `name`: fetch leaves it in repo/ (bare) or repo/.git (a clone)."""
    for d in (mirrors / name / "repo" / ".git", mirrors / name / "repo", mirrors / name / ".git", mirrors / name):
        if (d / "HEAD").is_file() and (d / "objects").is_dir():
            return d
    return None


def _git(gd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "--git-dir", str(gd), *args], capture_output=True)


def read_blob(gd: Path, commit: str, path: str, hops: int = 5) -> bytes | None:
    """The file's bytes at `commit`, following a symlink to what it names (L-025: GitHub shows the target)."""
    listed = _git(gd, "ls-tree", commit, "--", path).stdout.split(b"\t")[0].split()
    if not listed:
        return None
    data = _git(gd, "cat-file", "blob", listed[2].decode()).stdout
    if listed[0] == b"120000" and hops:
        return read_blob(gd, commit, posixpath.normpath(posixpath.join(posixpath.dirname(path), data.decode())),
                         hops - 1)
    return data


def candidate_paths(gd: Path, commit: str, path: str, name: str) -> list[str]:
    """Where a case's file `name` may come from, nearest first: the source file, the file of that name
    beside it, the other files beside it, then files of that name elsewhere in the commit, those sharing
    the longest folder prefix with the source first (L-039's failures.txt is one folder up, L-025's
    debug-internal.log in a wandb folder below)."""
    folder = posixpath.dirname(path)
    listed = _git(gd, "ls-tree", "-r", "--name-only", commit).stdout.decode(errors="replace").splitlines()
    beside = [p for p in listed if posixpath.dirname(p) == folder and p != path]
    sibling = posixpath.join(folder, name)
    elsewhere = [p for p in listed if posixpath.basename(p) == name and posixpath.dirname(p) != folder]
    elsewhere.sort(key=lambda p: -len(posixpath.commonpath([folder, posixpath.dirname(p)]) if folder else 0))
    return [path] + [p for p in beside if p == sibling] + [p for p in beside if p != sibling] + elsewhere


# ---- recipes: pure functions on bytes ------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercased, punctuation dropped, spaces to hyphens."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(lines: list[bytes]) -> list[tuple[int, int]]:
    """(line index, level) of each markdown heading, skipping fenced code (a `# comment` in a shell
    block is no heading)."""
    out, fenced = [], False
    for i, line in enumerate(lines):
        if line.lstrip().startswith(b"```"):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            out.append((i, len(m.group(1))))
    return out


def section(data: bytes, heading: str) -> bytes | None:
    """The heading line (matched by its text or its anchor) and what follows, up to the next heading of
    the same or a higher level: a logbook entry as the earlier copies cut it."""
    lines = data.splitlines(keepends=True)
    marks = headings(lines)
    for k, (i, level) in enumerate(marks):
        text = lines[i].decode("utf-8", "replace").strip()
        if heading in (text, slug(text)):
            end = next((j for j, lv in marks[k + 1:] if lv <= level), len(lines))
            return b"".join(lines[i:end])
    return None


def cut(data: bytes, head: int, tail: int) -> bytes:
    """The first `head` and last `tail` lines around one CUT line."""
    lines = data.splitlines(keepends=True)
    return b"".join(lines[:head]) + CUT + b"".join(lines[len(lines) - tail:] if tail else [])


def apply(data: bytes, recipe: dict) -> bytes | None:
    if "section" in recipe:
        data = section(data, recipe["section"])
        if data is None:
            return None
    if "lines" in recipe:
        a, b = recipe["lines"]
        data = b"".join(data.splitlines(keepends=True)[a - 1:b])
    if "head" in recipe:
        data = cut(data, recipe["head"], recipe["tail"])
    return data


def digest(data: bytes) -> dict:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


# ---- search: recipes whose output has a given digest ----------------------------------------------

def _prefix(lines: list[bytes]) -> list[int]:
    sums = [0]
    for line in lines:
        sums.append(sums[-1] + len(line))
    return sums


def find_in(data: bytes, want: dict, markdown: bool) -> dict | None:
    """A recipe (without `path`) that turns `data` into bytes of digest `want`, or None. Only sizes that
    add up are hashed, so even a cut of a large file is one pass over its lines."""
    size, sha = want["bytes"], want["sha256"]

    def hit(b: bytes | None) -> bool:
        return b is not None and len(b) == size and hashlib.sha256(b).hexdigest() == sha

    if hit(data):
        return {}
    lines = data.splitlines(keepends=True)
    sums = _prefix(lines)
    n = len(lines)
    if markdown:
        for i, _ in headings(lines):
            text = lines[i].decode("utf-8", "replace").strip()
            part = section(data, text)
            if hit(part):
                return {"section": text}
    # head N + CUT + tail M: for each N the tail's size is fixed, and suffix sizes are distinct.
    suffix = {sums[n] - sums[n - m]: m for m in range(n + 1)}
    for head in range(n + 1):
        m = suffix.get(size - len(CUT) - sums[head])
        if m is not None and head + m <= n and hit(cut(data, head, m)):
            return {"head": head, "tail": m}
    # lines A..B: for each start the end is fixed by the size.
    where = {s: j for j, s in enumerate(sums)}
    for a in range(n):
        b = where.get(sums[a] + size)
        if b is not None and b > a and hit(b"".join(lines[a:b])):
            return {"lines": [a + 1, b]}
    if markdown:  # a cut entry of a logbook
        for i, _ in headings(lines):
            text = lines[i].decode("utf-8", "replace").strip()
            found = find_in(section(data, text), want, False)
            if found and "lines" not in found:
                return {"section": text, **found}
    return None


def search(gd: Path, commit: str, main_path: str, name: str, want: dict) -> dict | None:
    """A full recipe (with `path` where it is not the source file) for file `name` of a case."""
    for path in candidate_paths(gd, commit, main_path, name):
        data = read_blob(gd, commit, path)
        if data is None or len(data) < want["bytes"] - len(CUT):
            continue
        found = find_in(data, want, path.endswith(".md"))
        if found is not None:
            return ({} if path == main_path else {"path": path}) | found
    # last, a whole file of the commit under another name and folder: only blobs of exactly the wanted
    # size are read (a file renamed in the copy, such as run/train.err kept as err.txt)
    for row in _git(gd, "ls-tree", "-r", "-l", commit).stdout.decode(errors="replace").splitlines():
        meta, _, path = row.partition("\t")
        parts = meta.split()
        if len(parts) == 4 and parts[3] == str(want["bytes"]):
            data = read_blob(gd, commit, path)
            if data is not None and digest(data) == want:
                return {"path": path}
    return None


# ---- one case -------------------------------------------------------------------------------------

def default_recipe(case: dict, name: str, src: dict) -> dict:
    """What a file is when the manifest names no recipe: the source file (a section for a .md #anchor) is
    the file of its own name, else `log.txt`, else the only one; another file is the file of its name beside it."""
    base = posixpath.basename(src["path"])
    main = base if base in case["files"] else "log.txt" if "log.txt" in case["files"] else case["files"][0]
    if name == main:
        return {"section": src["anchor"]} if src["anchor"] and src["path"].endswith(".md") else {}
    return {"path": posixpath.join(posixpath.dirname(src["path"]), name)}


def truth_of(case: dict) -> dict:
    truth = {k: case[k] for k in FIELDS if case.get(k) is not None}
    if case.get("split") and case["split"] != split_of(truth):
        truth["split"] = case["split"]  # a case moved to dev after being fixed against (README)
    return truth


def set_dir(case_id: str) -> str:
    return re.match(r"[A-Za-z]+", case_id).group(0).lower()


def rebuild_case(case: dict, mirrors: Path, out: Path, do_search: bool = False) -> dict:
    """Write the case's folder; return {"files": {file: status}} with status exact / mismatch / missing,
    and the recipes search found (under `found`). A case with a file missing gets no folder: one with
    part of its files would score as a different case, and build_manifest.py would shrink its entry."""
    src = parse_url(case["source_url"])
    result: dict = {"files": {}, "found": {}}
    gd = git_dir(mirrors, src["repo"]) if src else None
    made: dict[str, bytes] = {}
    recipes = case.get("extract") or {}
    for name in case["files"]:
        want = (case.get("digests") or {}).get(name)
        if gd is None:
            result["files"][name] = "missing: no mirror of " + (src["repo"] if src else case["source_url"])
            continue
        recipe = recipes.get(name, default_recipe(case, name, src))
        raw = read_blob(gd, src["commit"], recipe.get("path", src["path"]))
        data = apply(raw, recipe) if raw is not None else None
        if want and (data is None or digest(data) != want) and do_search:
            found = search(gd, src["commit"], src["path"], name, want)
            if found is not None:
                recipe, data = found, apply(read_blob(gd, src["commit"], found.get("path", src["path"])), found)
                result["found"][name] = found
        if data is None:
            result["files"][name] = f"missing: {recipe.get('path', src['path'])} at {src['commit'][:12]}"
            continue
        made[name] = data
        result["files"][name] = "no digest" if not want else "exact" if digest(data) == want else (
            f"mismatch: {len(data)} bytes, want {want['bytes']}")
    if len(made) == len(case["files"]):
        folder = out / set_dir(case["id"]) / case["id"]
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in made.items():
            (folder / name).write_bytes(data)
        (folder / "truth.yaml").write_text(yaml.safe_dump(truth_of(case), sort_keys=False, allow_unicode=True,
                                                          width=110), encoding="utf-8")
    return result


def status(result: dict) -> str:
    states = [s.split(":")[0] for s in result["files"].values()]
    return "missing" if "missing" in states else "mismatch" if "mismatch" in states else "exact"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mirrors", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--manifest", type=Path, default=ROOT / "corpus" / "real-cases.yaml")
    ap.add_argument("--only", default="", help="comma-separated case ids")
    ap.add_argument("--search", action="store_true", help="search for recipes where the default misses")
    ap.add_argument("--record", action="store_true", help="with --search: write found recipes to the manifest")
    args = ap.parse_args(argv)
    doc = yaml.safe_load(args.manifest.read_text(encoding="utf-8"))
    only = {x for x in args.only.split(",") if x}
    cases = [c for c in doc["cases"] if c.get("commit") and (not only or c["id"] in only)]
    report, counts = {}, {"exact": 0, "mismatch": 0, "missing": 0}
    for case in cases:
        result = rebuild_case(case, args.mirrors, args.out, args.search)
        report[case["id"]] = result
        counts[status(result)] += 1
        if status(result) != "exact":
            print(f"{case['id']}: " + "; ".join(f"{k} {v}" for k, v in result["files"].items()))
        if result["found"] and args.record:
            case["extract"] = (case.get("extract") or {}) | result["found"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rebuild-report.json").write_text(json.dumps({"counts": counts, "cases": report}, indent=1))
    print(f"{len(cases)} cases: {counts['exact']} exact, {counts['mismatch']} mismatch, "
          f"{counts['missing']} source missing")
    if args.record:
        args.manifest.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110),
                                 encoding="utf-8")
    return 0 if counts["exact"] == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
