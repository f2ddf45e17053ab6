"""Typed, immutable form of a rule pack after loading and validation."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property


@dataclass(frozen=True)
class LogMatch:
    """Match log lines: any of `literals` (case-insensitive prefilter), then `regex`."""

    literals: tuple[str, ...]
    regex: str
    sources: tuple[str, ...] = ()  # empty: any source
    captures: tuple[str, ...] = ()  # named groups of `regex`, in order


@dataclass(frozen=True)
class JobMatch:
    """Match scheduler state of a job attempt (any listed value of each given field)."""

    states: tuple[str, ...] = ()
    exit_codes: tuple[int, ...] = ()
    signals: tuple[int, ...] = ()


@dataclass(frozen=True)
class MetricMatch:
    """Match samples of one metric (faultline.rules.metric): kind rise | above | below | outlier."""

    name: str
    kind: str
    min_increase: float = 1.0
    threshold: float | None = None
    for_s: float = 0.0
    stat: str = "increase"
    factor: float = 3.0
    min_value: float = 1.0
    min_nodes: int = 3
    labels: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Emits:
    symptom: str
    role: str
    domain: str
    implicates: str
    outcome: str
    summary: str = ""  # root-cause sentence template; {name} are captures
    peer: str = ""  # capture naming the implicated peer (address or host) when implicates=peer
    address: str = ""  # capture holding an address that belongs to the line's node (address map)
    peer_rank: str = ""  # capture naming the implicated rank(s) when implicates=peer (e.g. a desync report)


@dataclass(frozen=True)
class Places:
    """A header line's identity given to the lines of its block: the next `within` lines of the same
    file that emit one of `symptoms` and lack it take the header's `gives` columns (node, rank); `peer`
    replaces the line's own peer with the header's (a block that names the lost node by its address
    above the line that names it only by an id)."""

    symptoms: tuple[str, ...]
    within: int
    gives: tuple[str, ...]


@dataclass(frozen=True)
class Section:
    """A section header: lines of `symptoms` below it in the same file (within `within` lines, up to the
    next section header of theirs) take `role` and `implicates`; a header with neither ends the section above."""

    symptoms: tuple[str, ...]
    within: int
    role: str = ""
    implicates: str = ""  # and whom they blame (`none`: victims' lines name no culprit)


@dataclass(frozen=True)
class Lookup:
    """Per-capture-value overrides of `emits` (e.g. Xid code -> outcome, role, action)."""

    capture: str
    table: str  # CSV file beside the rule file
    rows: tuple[dict, ...] = ()


@dataclass(frozen=True)
class RuleTest:
    line: str
    expect: dict = field(default_factory=dict)  # captures and fields the match must carry
    source: str = "applog"
    where: str = ""
    job: dict | None = None  # for scheduler-state rules: state, exit_code, signal of a job attempt
    metric: dict | None = None  # for metric rules: series, interval, start, end, expect (rules.metric.parse_test)


@dataclass(frozen=True)
class AtStartup:
    """What a rule's line means when the job shows no training progress at all: the same error at
    start-up has another cause (a data path that is missing before the first step was never there:
    config, not storage that failed mid-run)."""
    outcome: str
    summary: str = ""
    domain: str = ""
    action: str = ""


@dataclass(frozen=True)
class ResolvedBy:
    """An outage that a later line of the same file says is over (`nfs: server X OK` after `not
    responding`): the rule's match is set aside when a line of one of `symptoms` follows it in that file,
    with the captures named in `same` equal (the same server)."""

    symptoms: tuple[str, ...]
    same: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    status: str
    description: str
    pack: str
    path: str
    emits: Emits
    log: LogMatch | None = None
    job: JobMatch | None = None
    metric: MetricMatch | None = None
    references: tuple[str, ...] = ()
    priority: int = 50
    supersedes: tuple[str, ...] = ()
    supersedes_within: int = 0  # > 0: supersede only matches in the next N lines of the same file
    recoverable: bool = False  # set aside when the same file shows training progress after it
    resolved_by: ResolvedBy | None = None  # set aside when a later line of the same file says it is over
    refuted_by_ranks: bool = False  # set aside when a rank printed a later line of the same file
    at_startup: AtStartup | None = None  # outcome (summary, domain, action) when the job never trained
    places: Places | None = None  # a block header: gives its node/rank to the block's lines
    section: Section | None = None  # a section header: sets the role of the section's lines
    action: str = ""
    lookup: Lookup | None = None
    tests_match: tuple[RuleTest, ...] = ()
    tests_no_match: tuple[RuleTest, ...] = ()


@dataclass(frozen=True)
class Ruleset:
    rules: tuple[Rule, ...]
    packs: tuple[str, ...]
    version: str  # content hash of every pack file

    def by_id(self) -> dict[str, Rule]:
        return {r.id: r for r in self.rules}

    # Cached: the extract phase caches per-object work by identity, so these tuples must be the same
    # objects on every call (a fresh tuple per diagnosis grew that cache by ~115 KB each time).
    @cached_property
    def log_rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.log is not None and r.status != "deprecated")

    @cached_property
    def minimal_literals(self) -> tuple[str, ...]:
        """The extract prefilter's literals (rules.literals.prefilter_literals). The loader computes them
        before it caches the ruleset, so a ruleset from the cache carries them (~10-15 ms a start)."""
        from faultline.rules.literals import _minimal_literals

        return _minimal_literals(tuple(sorted({lit for r in self.log_rules for lit in r.log.literals})))

    @cached_property
    def log_routes(self) -> tuple[list[str], list[list[int]]]:
        """rules.literals.route_literals of log_rules, which the reader, the collector and extract each ask
        for (~5 ms a call); carried in the ruleset cache like minimal_literals."""
        from faultline.rules.literals import route_literals

        return route_literals(self.log_rules)

    @cached_property
    def metric_rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.metric is not None and r.status != "deprecated")

    @cached_property
    def job_rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.job is not None and r.status != "deprecated")
