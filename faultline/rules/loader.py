"""Load rule packs from YAML, validate them and report every problem at once.

A pack is a folder `packs/<pack>/` of YAML files, each holding `rules: [...]`.
Problems are collected with file and line so an operator can fix them in one pass.
"""

from __future__ import annotations

import csv
import gc
import hashlib
import os
import pickle
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


from faultline import taxonomy
from faultline.rules.model import (AtStartup, Emits, JobMatch, LogMatch, Lookup, Places, ResolvedBy, Rule, RuleTest,
                                   Ruleset, Section)

BUILTIN_PACKS = Path(__file__).parent / "packs"
_GROUP_NAME = re.compile(r"\(\?P?<([A-Za-z_][A-Za-z0-9_]*)>")
_TEMPLATE_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# `{{name}}` in a regex stands for a pack's named fragment (never valid regex syntax itself, so unambiguous).
_FRAGMENT_REF = re.compile(r"(?<!\\)\{\{([^{}\n]*)\}\}")
_FRAGMENT_NAME = re.compile(r"[a-z][a-z0-9_]*")
# Captures the engine gives meaning to; any other name is kept as plain evidence.
LINE_FIELDS = ("node", "rank", "local_rank", "gpu")
_EMIT_FIELDS = ("symptom", "role", "domain", "implicates", "outcome", "summary", "peer", "address", "peer_rank")
# `title` documents a row; `supersedes` (space-separated) makes the row's symptom supersede them.
_LOOKUP_FIELDS = _EMIT_FIELDS + ("action", "priority", "title", "supersedes")


@dataclass
class Problem:
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class RulesetError(Exception):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


@lru_cache(maxsize=1)
def _line_loader():
    """SafeLoader (libyaml's C parser when present: ~8x faster) that remembers each mapping's line as
    `__line__`. Made (and yaml imported, ~25 ms) only when packs are parsed: a cached ruleset needs neither."""
    import yaml

    def construct_mapping(loader, node, deep=False):
        mapping = yaml.SafeLoader.construct_mapping(loader, node, deep=deep)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping

    class LineLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        pass

    LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return yaml, LineLoader


def regex_problem(regex: str) -> str | None:
    """Compile with the engine's own regex (Rust, via Polars) and say what is wrong, if anything."""
    import polars as pl  # here: a ruleset from the cache needs no Polars (the CLI reads before its import ends)

    try:
        pl.Series([""], dtype=pl.String).str.contains(regex)
    except Exception as exc:  # polars raises ComputeError with the Rust message
        return str(exc).splitlines()[0][:300]
    return None


def _as_tuple(value) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)


class _Builder:
    def __init__(self):
        self.problems: list[Problem] = []
        self.fragments: dict[str, str] = {}
        self.fragment_origin: dict[str, str] = {}

    def add_fragments(self, raw, where: str) -> None:
        """A pack file's top-level `fragments:` mapping, name -> regex: a shape several rules' regexes share
        (a launcher-prefix group), written once. Names are global to the loaded packs, so an operator's pack
        can use a built-in fragment; each must compile on its own, so a broken one is reported where it is."""
        if not isinstance(raw, dict):
            self.bad(where, "fragments must be a mapping of name -> regex")
            return
        for name, regex in raw.items():
            if name == "__line__":
                continue
            at = f"{where} (fragment {name})"
            if not isinstance(name, str) or not _FRAGMENT_NAME.fullmatch(name):
                self.bad(at, "a fragment name is lowercase letters, digits and _")
            elif name in self.fragments:
                self.bad(at, f"fragment {name!r} is defined twice (also in {self.fragment_origin[name]})")
            elif not isinstance(regex, str) or not regex:
                self.bad(at, "a fragment is a non-empty regex string")
            elif _FRAGMENT_REF.search(regex):
                self.bad(at, "a fragment cannot use another fragment")
            elif problem := regex_problem(regex):
                self.bad(at, f"fragment does not compile: {problem}")
            else:
                self.fragments[name] = regex
                self.fragment_origin[name] = where

    def expand(self, regex: str, where: str) -> str:
        """The regex with each `{{name}}` replaced by that fragment, bracketed so it stays one atom."""
        def one(m: re.Match) -> str:
            name = m.group(1)
            if name not in self.fragments:
                self.bad(where, f"match.log.regex uses unknown fragment {{{{{name}}}}} "
                                f"(known: {', '.join(sorted(self.fragments)) or 'none'})")
                return ""
            return f"(?:{self.fragments[name]})"
        return _FRAGMENT_REF.sub(one, regex)

    def bad(self, where: str, message: str) -> None:
        self.problems.append(Problem(where, message))

    def rule(self, raw: dict, pack: str, path: Path) -> Rule | None:
        where = f"{path}:{raw.get('__line__', '?')}"
        rid = raw.get("id")
        if not isinstance(rid, str) or not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)+", rid or ""):
            self.bad(where, f"id {rid!r} must be dotted lowercase, e.g. 'nccl.watchdog_timeout'")
            rid = str(rid)
        where = f"{where} ({rid})"
        for key in ("title", "description"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                self.bad(where, f"'{key}' is required")
        status = raw.get("status", "experimental")
        if status not in taxonomy.STATUSES:
            self.bad(where, f"status {status!r} not in {taxonomy.STATUSES}")
        known = {"id", "title", "status", "description", "references", "match", "emits", "priority",
                 "supersedes", "supersedes_within", "recoverable", "refuted_by_ranks", "resolved_by", "at_startup", "places", "section", "action", "lookup", "tests", "__line__"}
        for key in raw:
            if key not in known:
                self.bad(where, f"unknown key {key!r}")

        match = raw.get("match") or {}
        log = self._log_match(match.get("log"), where) if "log" in match else None
        job = self._job_match(match.get("job"), where) if "job" in match else None
        metric = None
        if "metric" in match:  # samples of the metrics table (faultline.rules.metric)
            from faultline.rules import metric as metric_rules
            metric = metric_rules.parse_match(match.get("metric"), where, self.bad)
        if log is None and job is None and metric is None:
            self.bad(where, "'match' needs 'log', 'job' or 'metric'")
        captures = log.captures if log else metric_rules.CAPTURES if metric else ()

        lookup = self._lookup(raw.get("lookup"), captures, path, where) if raw.get("lookup") else None
        emits = self._emits(raw.get("emits") or {}, captures, where)
        action = raw.get("action", "") or ""
        if action and action not in taxonomy.ACTIONS:
            self.bad(where, f"action {action!r} not in {taxonomy.ACTIONS}")
        priority = raw.get("priority", 50)
        if not isinstance(priority, int) or not 0 <= priority <= 100:
            self.bad(where, "priority must be an integer 0..100")
            priority = 50

        within = raw.get("supersedes_within", 0)
        if not isinstance(within, int) or not 0 <= within <= 10_000:
            self.bad(where, "supersedes_within must be a whole number of lines (0..10000)")
            within = 0
        if within and not raw.get("supersedes"):
            self.bad(where, "supersedes_within needs supersedes")
        for flag in ("recoverable", "refuted_by_ranks"):
            if not isinstance(raw.get(flag, False), bool):
                self.bad(where, f"{flag} is true or false")
        if raw.get("refuted_by_ranks") and log is None:
            self.bad(where, "refuted_by_ranks needs a log match (ranks are read from log lines)")

        at_startup = self._at_startup(raw["at_startup"], log, emits, where) if "at_startup" in raw else None
        places = self._places(raw["places"], log, where) if "places" in raw else None
        resolved_by = self._resolved_by(raw["resolved_by"], log, where) if "resolved_by" in raw else None
        section = self._section(raw["section"], log, where) if "section" in raw else None

        tests = raw.get("tests") or {}
        if metric is not None:  # promtool-style cases: input series, the expected symptom, its absence
            t_match, t_no = (tuple(RuleTest(line="", where=where, metric=c) for c in
                                   (metric_rules.parse_test(t, where, self.bad) for t in tests.get(k) or ()) if c)
                             for k in ("match", "no_match"))
        else:
            t_match = tuple(self._test(t, where) for t in tests.get("match") or ())
            t_no = tuple(self._test(t, where) for t in tests.get("no_match") or ())
        if not t_match:
            self.bad(where, "rule has no tests: add tests.match (and tests.no_match) lines")
        if metric is None and any((t.job is None) != (job is None) for t in t_match + t_no):
            self.bad(where, "tests of a log rule are lines; tests of a job rule are `job: {state, exit_code, signal}`")
        if log is not None:
            for t in t_match:
                if not any(lit in t.line.lower() for lit in log.literals):
                    self.bad(t.where, f"no literal of {list(log.literals)} occurs in test line {t.line[:80]!r}")
        return Rule(
            id=rid, title=str(raw.get("title", "")).strip(), status=status,
            description=" ".join(str(raw.get("description", "")).split()),
            pack=pack, path=str(path), emits=emits, log=log, job=job, metric=metric,
            references=tuple(str(r) for r in _as_tuple(raw.get("references"))),
            priority=priority, supersedes=tuple(str(s) for s in _as_tuple(raw.get("supersedes"))),
            supersedes_within=within, recoverable=bool(raw.get("recoverable", False)),
            refuted_by_ranks=bool(raw.get("refuted_by_ranks", False)), resolved_by=resolved_by,
            at_startup=at_startup, places=places,
            section=section, action=action, lookup=lookup, tests_match=t_match, tests_no_match=t_no,
        )

    def _at_startup(self, raw, log: LogMatch | None, emits: Emits, where) -> AtStartup | None:
        if not isinstance(raw, dict):
            self.bad(where, "at_startup is a mapping of outcome, summary, domain and action")
            return None
        if set(raw) - {"outcome", "summary", "domain", "action", "__line__"}:
            self.bad(where, "at_startup is a mapping of outcome, summary, domain and action: "
                     f"unknown {sorted(set(raw) - {'outcome', 'summary', 'domain', 'action', '__line__'})}")
        if log is None:
            self.bad(where, "at_startup needs a log match (progress is read from log lines)")
        out = AtStartup(outcome=str(raw.get("outcome", "")), summary=" ".join(str(raw.get("summary", "")).split()),
                        domain=str(raw.get("domain", "")), action=str(raw.get("action", "")))
        if out.outcome not in taxonomy.OUTCOMES:
            self.bad(where, f"at_startup.outcome {out.outcome!r} not in {tuple(taxonomy.OUTCOMES)}")
        if out.outcome == emits.outcome:
            self.bad(where, "at_startup.outcome is the rule's own outcome: drop at_startup")
        if out.domain and out.domain not in taxonomy.DOMAINS:
            self.bad(where, f"at_startup.domain {out.domain!r} not in {taxonomy.DOMAINS}")
        if out.action and out.action not in taxonomy.ACTIONS:
            self.bad(where, f"at_startup.action {out.action!r} not in {taxonomy.ACTIONS}")
        captures = log.captures if log else ()
        for name in _TEMPLATE_FIELD.findall(out.summary):
            if name not in captures and name not in ("node", "rank", "gpu"):
                self.bad(where, f"at_startup.summary uses {{{name}}}, which is not a capture")
        return out

    def _places(self, raw, log: LogMatch | None, where) -> Places | None:
        if not isinstance(raw, dict) or set(raw) - {"symptoms", "within", "gives", "__line__"}:
            self.bad(where, "places is a mapping of symptoms, within and gives")
            return None
        symptoms = tuple(str(s) for s in _as_tuple(raw.get("symptoms")))
        within, gives = raw.get("within"), tuple(str(g) for g in _as_tuple(raw.get("gives")))
        if log is None:
            self.bad(where, "places needs a log match (a header line)")
        if not symptoms:
            self.bad(where, "places.symptoms: name the symptoms of the block's lines")
        if not isinstance(within, int) or not 1 <= within <= 1000:
            self.bad(where, "places.within must be a whole number of lines (1..1000)")
            within = 1
        if not gives or set(gives) - {"node", "rank", "peer"}:
            self.bad(where, "places.gives lists node, rank and/or peer")
        return Places(symptoms=symptoms, within=within, gives=gives)

    def _resolved_by(self, raw, log: LogMatch | None, where) -> ResolvedBy | None:
        if not isinstance(raw, dict) or set(raw) - {"symptoms", "same", "__line__"}:
            self.bad(where, "resolved_by is a mapping of symptoms and (optionally) same")
            return None
        symptoms = tuple(str(s) for s in _as_tuple(raw.get("symptoms")))
        same = tuple(str(c) for c in _as_tuple(raw.get("same")))
        if log is None:
            self.bad(where, "resolved_by needs a log match")
        if not symptoms:
            self.bad(where, "resolved_by.symptoms: name the symptoms of the lines that end the outage")
        for c in same:
            if log is not None and c not in log.captures:
                self.bad(where, f"resolved_by.same: {c!r} is not a capture of the regex")
        return ResolvedBy(symptoms=symptoms, same=same)

    def _section(self, raw, log: LogMatch | None, where) -> Section | None:
        if not isinstance(raw, dict) or set(raw) - {"symptoms", "within", "role", "implicates", "__line__"}:
            self.bad(where, "section is a mapping of symptoms, within and (optionally) role and implicates")
            return None
        symptoms = tuple(str(s) for s in _as_tuple(raw.get("symptoms")))
        within, role, implicates = raw.get("within"), str(raw.get("role") or ""), str(raw.get("implicates") or "")
        if log is None:
            self.bad(where, "section needs a log match (a header line)")
        if not symptoms:
            self.bad(where, "section.symptoms: name the symptoms of the section's lines")
        if not isinstance(within, int) or not 1 <= within <= 100_000:
            self.bad(where, "section.within must be a whole number of lines (1..100000)")
            within = 1
        if role and role not in taxonomy.ROLES:
            self.bad(where, f"section.role {role!r} not in {taxonomy.ROLES}")
        if implicates and implicates not in taxonomy.IMPLICATES:
            self.bad(where, f"section.implicates {implicates!r} not in {taxonomy.IMPLICATES}")
        return Section(symptoms=symptoms, within=within, role=role, implicates=implicates)

    def _log_match(self, raw, where) -> LogMatch | None:
        if not isinstance(raw, dict):
            self.bad(where, "match.log must be a mapping with 'literals' and 'regex'")
            return None
        literals = tuple(str(x).lower() for x in _as_tuple(raw.get("literals")))
        if not literals or any(len(x) < 3 for x in literals):
            self.bad(where, "match.log.literals: give one or more literals of 3+ characters (case-insensitive prefilter)")
        regex = raw.get("regex")
        if not isinstance(regex, str) or not regex:
            self.bad(where, "match.log.regex is required")
            return None
        regex = self.expand(regex, where)
        problem = regex_problem(regex)
        if problem:
            self.bad(where, f"match.log.regex does not compile: {problem}")
        sources = tuple(_as_tuple(raw.get("sources")))
        for s in sources:
            if s not in taxonomy.SOURCES:
                self.bad(where, f"source {s!r} not in {taxonomy.SOURCES}")
        names = tuple(_GROUP_NAME.findall(regex))
        if len(set(names)) != len(names):
            self.bad(where, "match.log.regex repeats a capture name")
        return LogMatch(literals=literals, regex=regex, sources=sources, captures=names)

    def _job_match(self, raw, where) -> JobMatch | None:
        if not isinstance(raw, dict):
            self.bad(where, "match.job must be a mapping")
            return None
        states = tuple(str(s) for s in _as_tuple(raw.get("states")))
        for s in states:
            if s not in taxonomy.JOB_STATES:
                self.bad(where, f"job state {s!r} not in {taxonomy.JOB_STATES}")
        return JobMatch(states=states,
                        exit_codes=tuple(int(x) for x in _as_tuple(raw.get("exit_codes"))),
                        signals=tuple(int(x) for x in _as_tuple(raw.get("signals"))))

    def _emits(self, raw: dict, captures: tuple[str, ...], where: str) -> Emits:
        values = {k: str(raw.get(k, "") or "") for k in _EMIT_FIELDS}
        values["summary"] = " ".join(values["summary"].split())
        checks = (("role", taxonomy.ROLES), ("domain", taxonomy.DOMAINS),
                  ("implicates", taxonomy.IMPLICATES), ("outcome", tuple(taxonomy.OUTCOMES)))
        for key, allowed in checks:
            if values[key] not in allowed:
                self.bad(where, f"emits.{key} {values[key]!r} not in {allowed}")
        if not re.fullmatch(r"[a-z0-9_]+", values["symptom"]):
            self.bad(where, "emits.symptom must be snake_case")
        # implicates=peer with neither: the peer is given by a block header above the line (places.gives peer),
        # checked once the whole ruleset is loaded
        if (values["implicates"] == "peer" and (values["peer"] or values["peer_rank"])
                and values["peer"] not in captures and values["peer_rank"] not in captures):
            self.bad(where, "emits.implicates=peer needs emits.peer (or emits.peer_rank) naming a capture of the regex")
        for key in ("peer", "peer_rank"):
            if values[key] and values[key] not in captures:
                self.bad(where, f"emits.{key} {values[key]!r} is not a capture of the regex")
        if values["address"] and values["address"] not in captures:
            self.bad(where, f"emits.address {values['address']!r} is not a capture of the regex")
        for name in _TEMPLATE_FIELD.findall(values["summary"]):
            if name not in captures and name not in ("node", "rank", "gpu"):
                self.bad(where, f"emits.summary uses {{{name}}}, which is not a capture")
        for key in raw:
            if key not in _EMIT_FIELDS and key != "__line__":
                self.bad(where, f"unknown key emits.{key}")
        return Emits(**values)

    def _lookup(self, raw, captures, path: Path, where) -> Lookup | None:
        if not isinstance(raw, dict) or raw.get("capture") not in captures:
            self.bad(where, "lookup needs 'capture' (a capture of the regex) and 'table' (a CSV beside the file)")
            return None
        table = path.parent / str(raw.get("table", ""))
        if not table.is_file():
            self.bad(where, f"lookup table {table} not found")
            return None
        with table.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
        if not rows or "key" not in rows[0]:
            self.bad(f"{table}:1", "lookup table needs a 'key' column")
            return None
        for n, row in enumerate(rows, start=2):
            for col, allowed in (("role", taxonomy.ROLES), ("domain", taxonomy.DOMAINS),
                                 ("implicates", taxonomy.IMPLICATES), ("outcome", tuple(taxonomy.OUTCOMES)),
                                 ("action", taxonomy.ACTIONS)):
                if row.get(col) and row[col] not in allowed:
                    self.bad(f"{table}:{n}", f"{col} {row[col]!r} not in {allowed}")
        for n, row in enumerate(rows, start=2):
            for name in _TEMPLATE_FIELD.findall(row.get("summary") or ""):
                if name not in captures and name not in ("node", "rank", "gpu"):
                    self.bad(f"{table}:{n}", f"summary uses {{{name}}}, which is not a capture")
        unknown = set(rows[0]) - set(_LOOKUP_FIELDS) - {"key"}
        if unknown:
            self.bad(f"{table}:1", f"unknown columns {sorted(unknown)}")
        return Lookup(capture=raw["capture"], table=table.name,
                      rows=tuple({k: v for k, v in r.items() if v not in (None, "")} for r in rows))

    def _test(self, raw, where) -> RuleTest:
        if isinstance(raw, str):
            return RuleTest(line=raw, where=where)
        if isinstance(raw, dict) and isinstance(raw.get("job"), dict):
            here = f"{where.split(':')[0]}:{raw.get('__line__', '?')}"
            job = {k: v for k, v in raw["job"].items() if k != "__line__"}
            if job.get("state") not in (None, *taxonomy.JOB_STATES) or set(job) - {"state", "exit_code", "signal"}:
                self.bad(here, f"test job {job!r}: give state (one of JOB_STATES), exit_code, signal")
            expect = {k: v for k, v in raw.items() if k not in ("job", "__line__")}
            return RuleTest(line="", expect=expect, where=here, job=job)
        if not isinstance(raw, dict) or not isinstance(raw.get("line"), str):
            self.bad(where, f"test {raw!r} must be a line or a mapping with 'line'")
            return RuleTest(line="", where=where)
        here = f"{where.split(':')[0]}:{raw.get('__line__', '?')}"
        expect = {k: v for k, v in raw.items() if k not in ("line", "source", "__line__")}
        return RuleTest(line=raw["line"], expect=expect, source=raw.get("source", "applog"), where=here)


def pack_files(pack_dirs: list[Path]) -> list[tuple[str, Path]]:
    files = []
    for d in pack_dirs:
        for f in sorted(d.glob("*.yaml")) + sorted(d.glob("*.yml")):
            files.append((d.name, f))
    return files


def discover_packs(extra: list[Path] | None = None, builtin: bool = True) -> list[Path]:
    """Built-in packs plus operator packs; a folder with YAML files is a pack, a folder of such folders a set."""
    dirs: list[Path] = []
    if builtin:
        dirs += sorted(p for p in BUILTIN_PACKS.iterdir() if p.is_dir())
    for root in extra or []:
        root = Path(root)
        if any(root.glob("*.y*ml")):
            dirs.append(root)
        else:
            dirs += sorted(p for p in root.iterdir() if p.is_dir() and any(p.glob("*.y*ml")))
    return dirs


def _cache_file(dirs: list[Path]) -> Path | None:
    """Where the validated ruleset of exactly these pack files (and this loader, model and taxonomy) is kept.
    FAULTLINE_CACHE_DIR, else $XDG_CACHE_HOME/faultline or ~/.cache/faultline; `off` disables it."""
    where = os.environ.get("FAULTLINE_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "faultline")
    if where == "off":
        return None
    key = hashlib.sha256()
    for code in (Path(__file__), Path(__file__).with_name("model.py"), Path(taxonomy.__file__)):
        key.update(code.read_bytes())
    for d in dirs:
        # the folder resolved once: resolving each file was ~1,100 lstat calls (7 ms) before the first byte
        # of a log is read; a file's content is in the key, whatever its path names
        root = d.resolve()
        for name in sorted(n for n in os.listdir(root) if os.path.splitext(n)[1] in (".yaml", ".yml", ".csv")):
            f = root / name
            key.update(str(f).encode() + b"\0" + f.read_bytes() + b"\0")
    return Path(where) / f"ruleset-{key.hexdigest()[:32]}.pickle"


def load_ruleset(extra: list[Path] | None = None, builtin: bool = True) -> Ruleset:
    """Load and validate packs (operator rules with an existing id override the built-in one), or take
    the same packs' validated ruleset from the cache: validating ~400 regexes costs more than a small
    diagnosis. A cache that cannot be read or written is simply not used."""
    dirs = discover_packs(extra, builtin)
    cache = _cache_file(dirs)
    if cache is not None:
        # the collector would run a few times over the ~100 k objects being made, none of them garbage
        collecting = gc.isenabled()
        gc.disable()
        try:
            with cache.open("rb") as fh:
                cached = pickle.load(fh)  # noqa: S301 - written by this code, keyed by its own content
            if isinstance(cached, Ruleset):
                return cached
        except (OSError, EOFError, pickle.PickleError, AttributeError, ImportError, TypeError, ValueError):
            pass
        finally:
            if collecting:
                gc.enable()
    ruleset = _load_ruleset(dirs)
    if cache is not None:
        ruleset.minimal_literals  # noqa: B018 - computed now, so that the cached ruleset carries them
        ruleset.log_routes  # noqa: B018 - likewise
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            with tmp.open("wb") as fh:
                pickle.dump(ruleset, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, cache)
        except OSError:
            pass
    return ruleset


def _load_ruleset(dirs: list[Path]) -> Ruleset:
    builder = _Builder()
    files = pack_files(dirs)
    digest = hashlib.sha256()
    rules: dict[str, Rule] = {}
    seen: dict[tuple[str, str], str] = {}
    docs = []
    for pack, path in files:
        data = path.read_bytes()
        digest.update(pack.encode() + b"\0" + path.name.encode() + b"\0" + data)
        yaml, line_loader = _line_loader()
        try:
            doc = yaml.load(data.decode("utf-8"), Loader=line_loader)  # noqa: S506 - SafeLoader subclass
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            builder.bad(str(path), f"not valid YAML: {exc}")
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("rules", []), list) or not (
                "rules" in doc or "fragments" in doc):
            builder.bad(str(path), "a pack file holds a mapping with a 'rules' list (and/or 'fragments')")
            continue
        unknown = set(doc) - {"rules", "fragments", "__line__"}
        if unknown:
            builder.bad(str(path), f"unknown top-level key(s) {sorted(unknown)}: a pack file has 'rules' and 'fragments'")
        if "fragments" in doc:
            line = doc["fragments"].get("__line__", "?") if isinstance(doc["fragments"], dict) else "?"
            builder.add_fragments(doc["fragments"], f"{path}:{line}")
        docs.append((pack, path, doc))
    # fragments first, from every file: a rule may use one defined in any loaded pack
    for pack, path, doc in docs:
        for raw in doc.get("rules", []):
            if not isinstance(raw, dict):
                builder.bad(str(path), f"rule entry {raw!r} is not a mapping")
                continue
            rule = builder.rule(raw, pack, path)
            if rule is None:
                continue
            origin = "builtin" if path.is_relative_to(BUILTIN_PACKS) else "operator"
            if (rule.id, origin) in seen:
                builder.bad(f"{path}:{raw.get('__line__')}", f"duplicate rule id {rule.id} (also in {seen[rule.id, origin]})")
            seen[rule.id, origin] = str(path)
            rules[rule.id] = rule  # operator packs load last and override built-in ids
    for d in dirs:
        for table in sorted(d.glob("*.csv")):
            digest.update(d.name.encode() + b"\0" + table.name.encode() + b"\0" + table.read_bytes())
    known = set(rules) | {r.emits.symptom for r in rules.values()}
    known |= {row["symptom"] for r in rules.values() if r.lookup for row in r.lookup.rows if row.get("symptom")}
    # A built-in pack loaded without the rest (an operator running only `slurm`) may supersede a symptom of
    # a built-in pack left out: not a typo (the whole built-in set is checked when it loads together).
    builtin_dirs = {p.resolve() for p in BUILTIN_PACKS.iterdir() if p.is_dir() and any(p.glob("*.y*ml"))}
    partial_builtin = not builtin_dirs <= {d.resolve() for d in dirs}
    for r in rules.values():
        lenient = partial_builtin and Path(r.path).resolve().is_relative_to(BUILTIN_PACKS.resolve())
        targets = [(r.path, "supersedes", t) for t in r.supersedes]
        targets += [(r.path, "places", t) for t in (r.places.symptoms if r.places else ())]
        targets += [(r.path, "section", t) for t in (r.section.symptoms if r.section else ())]
        if r.lookup:
            targets += [(f"{r.lookup.table} key {row['key']}", "supersedes", t) for row in r.lookup.rows
                        for t in row.get("supersedes", "").split()]
        for where, key, target in targets:
            if target not in known and not (lenient and key == "supersedes"):
                builder.bad(where, f"{r.id}: {key} unknown rule or symptom {target!r}")
    # A line that implicates a peer it does not name itself needs a header that gives it one.
    given_peer = {t for r in rules.values() if r.places and "peer" in r.places.gives for t in r.places.symptoms}
    for r in rules.values():
        lenient = partial_builtin and Path(r.path).resolve().is_relative_to(BUILTIN_PACKS.resolve())
        if (r.emits.implicates == "peer" and not r.emits.peer and not r.emits.peer_rank
                and r.emits.symptom not in given_peer and not lenient):
            builder.bad(r.path, f"{r.id}: emits.implicates=peer needs emits.peer (or emits.peer_rank) naming a capture "
                                "of the regex, or a header whose places gives peer to its symptom")
    if builder.problems:
        raise RulesetError(builder.problems)
    ordered = tuple(sorted(rules.values(), key=lambda r: r.id))
    return Ruleset(rules=ordered, packs=tuple(d.name for d in dirs), version=digest.hexdigest()[:16])
