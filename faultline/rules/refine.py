"""Phases 2 and 3, filter and refine, over the symptoms of many jobs at once.

filter: drop matches outside a job's window or node set, duplicate lines, and all but
        the most specific rule on each line.
refine: set aside what a present rule supersedes, and resolve implicated peers to
        nodes through the address map the logs themselves reveal.
"""

from __future__ import annotations

import polars as pl

from faultline.limits import MAX_WORLD
from faultline.rules.extract import KEY
from faultline.rules.model import Ruleset
from faultline.taxonomy import ROLE_TIER


def filter_symptoms(symptoms: pl.DataFrame, jobs: pl.DataFrame | None = None,
                    window_margin_s: int = 900) -> pl.DataFrame:
    """Keep matches inside each job's window (with a margin before start: kernel events precede
    the crash) and on its allocated nodes when the scheduler says which; one rule per line."""
    out = symptoms
    if jobs is not None and jobs.height and "start_time" in jobs.columns:
        win = jobs.select(*KEY, "start_time", "end_time")
        out = out.join(win, on=KEY, how="left").filter(
            pl.col("ts").is_null() | pl.col("start_time").is_null()
            | ((pl.col("ts") >= pl.col("start_time") - pl.duration(seconds=window_margin_s))
               & (pl.col("end_time").is_null() | (pl.col("ts") <= pl.col("end_time") + pl.duration(seconds=120))))
        ).drop("start_time", "end_time")
    # A Slurm line about another job (`*** JOB 61120 ON ...` left in a reused output file) is not
    # this job's evidence. Captures named `job`/`step` hold the Slurm id a line speaks of; compared
    # only when this job's id is a plain number (array and het ids are printed differently).
    spoken_of = pl.coalesce(pl.col("captures").str.json_path_match("$.job"),
                            pl.col("captures").str.json_path_match("$.step")).str.extract(r"^(\d+)")
    other_job = spoken_of.is_not_null() & pl.col("job_id").str.contains(r"^\d+$") & (spoken_of != pl.col("job_id"))
    # No plain-number job id (a job named after its file): no row can be another job's, and the JSON of every
    # row's captures is not parsed (twice: ~25 ms for the 12 k symptoms of a 209 MiB log)
    if out["job_id"].str.contains(r"^\d+$").any():
        out = out.filter(~other_job.fill_null(False))
    # The most specific reading of each line wins; ties keep every rule.
    out = out.filter(pl.col("priority") == pl.col("priority").max().over([*KEY, "file", "seq"]))
    return out.unique(subset=[*KEY, "file", "seq", "rule_id"], keep="first", maintain_order=True)


def _normalize_addr(col: pl.Expr) -> pl.Expr:
    """`10.0.0.7<4242>` / `[::ffff:10.0.0.7]:4242` / `host.domain` -> a comparable key."""
    return (col.str.replace(r"<\d+>$", "").str.replace(r"^\[?(?:::ffff:)?", "")
            .str.replace(r"\]?(?::\d+)?$", "").str.to_lowercase())


def _short_host(col: pl.Expr) -> pl.Expr:
    """`gpu-7.cluster.local` -> `gpu-7`; an IP address has no short form (`10.9.9.9` is not `10`)."""
    ip = col.str.contains(r"^\d{1,3}(?:\.\d{1,3}){3}$") | col.str.contains(":", literal=True)
    return pl.when(ip).then(None).otherwise(col.str.to_lowercase().str.split(".").list.first())


def supersession_edges(ruleset: Ruleset) -> pl.DataFrame:
    """(winner, target): a rule id or a symptom (lookup rows speak for their symptom) and what it explains,
    job-wide. Rules with `supersedes_within` explain only nearby lines (`local_edges`)."""
    edges = {(r.id, t) for r in ruleset.rules if not r.supersedes_within for t in r.supersedes}
    edges |= {(row["symptom"], t) for r in ruleset.rules if r.lookup for row in r.lookup.rows
              if row.get("symptom") for t in row.get("supersedes", "").split()}
    return pl.DataFrame(sorted(edges), schema={"winner": pl.String, "target": pl.String}, orient="row")


def supersede(symptoms: pl.DataFrame, ruleset: Ruleset) -> pl.DataFrame:
    """Mark rows whose rule or symptom is superseded by a rule or symptom present in the same job."""
    edge_df = supersession_edges(ruleset)
    if edge_df.height == 0 or symptoms.height == 0:
        return symptoms.with_columns(superseded_by=pl.lit(None, pl.String))
    present = pl.concat([symptoms.select(*KEY, winner=pl.col("rule_id")),
                         symptoms.select(*KEY, winner=pl.col("symptom"))]).unique()
    active = present.join(edge_df, on="winner")  # job x target superseded there
    by_rule = active.rename({"target": "rule_id"}).group_by([*KEY, "rule_id"]).agg(pl.col("winner").min().alias("w1"))
    by_sym = active.rename({"target": "symptom"}).group_by([*KEY, "symptom"]).agg(pl.col("winner").min().alias("w2"))
    out = (symptoms.join(by_rule, on=[*KEY, "rule_id"], how="left", maintain_order="left")
           .join(by_sym, on=[*KEY, "symptom"], how="left", maintain_order="left"))
    # Nothing supersedes itself (a symptom shared by winner and loser).
    mine = pl.col("rule_id"), pl.col("symptom")
    return out.with_columns(superseded_by=pl.coalesce(
        pl.when((pl.col("w1") != mine[0]) & (pl.col("w1") != mine[1])).then(pl.col("w1")),
        pl.when((pl.col("w2") != mine[0]) & (pl.col("w2") != mine[1])).then(pl.col("w2")),
    )).drop("w1", "w2")


_EDGE = {"rule_id": pl.String, "target": pl.String, "within": pl.Int64}


def local_edges(ruleset: Ruleset) -> pl.DataFrame:
    """(rule, target, within): a rule that explains only the next `within` lines of its own file
    (`Exception ignored in:` and the traceback right below it)."""
    rows = [(r.id, t, r.supersedes_within) for r in ruleset.rules if r.supersedes_within for t in r.supersedes]
    return pl.DataFrame(rows, schema=_EDGE, orient="row")


def set_aside_by_order(symptoms: pl.DataFrame, ruleset: Ruleset) -> pl.DataFrame:
    """Mark, in `superseded_by`, matches explained by a line just above them in the same file
    (`supersedes_within`: the traceback right below `Exception ignored in:`)."""
    near = local_edges(ruleset)
    if symptoms.height == 0 or near.height == 0:
        return symptoms
    by = [*KEY, "file"]
    rows = symptoms.with_row_index("_row").select("_row", *by, "seq", "rule_id", "symptom")
    win = rows.join(near, on="rule_id").select(*by, w_seq="seq", winner="rule_id", target="target", within="within")
    marks = [rows.join(win, left_on=[*by, col], right_on=[*by, "target"])
             .filter((pl.col("seq") > pl.col("w_seq")) & (pl.col("seq") <= pl.col("w_seq") + pl.col("within")))
             .select("_row", by_rule="winner") for col in ("rule_id", "symptom")]
    mark = pl.concat(marks).group_by("_row").agg(pl.col("by_rule").min())
    out = symptoms.with_row_index("_row").join(mark, on="_row", how="left", maintain_order="left")
    return out.with_columns(superseded_by=pl.coalesce("superseded_by", "by_rule")).drop("_row", "by_rule")


def resolve_peers(symptoms: pl.DataFrame, stats: pl.DataFrame | None = None) -> pl.DataFrame:
    """peer -> peer_node through addresses the job's own lines tie to nodes, or a node name (of a
    symptom, or of any line when `stats`, the per-node line counts, is given)."""
    addr = (symptoms.filter(pl.col("address").is_not_null() & pl.col("node").is_not_null())
            .select(*KEY, key=_normalize_addr(pl.col("address")), peer_node_a=pl.col("node"))
            .unique(subset=[*KEY, "key"], keep="first", maintain_order=True))
    known = [symptoms.filter(pl.col("node").is_not_null()).select(*KEY, pl.col("node"))]
    if stats is not None and stats.height:
        known.append(stats.filter(pl.col("node").is_not_null()).select(*KEY, pl.col("node")).cast(known[0].schema))
    nodes = pl.concat(known).unique()
    by_name = nodes.select(*KEY, key=pl.col("node").str.to_lowercase(), peer_node_n=pl.col("node"))
    by_short = (nodes.select(*KEY, key=_short_host(pl.col("node")), peer_node_s=pl.col("node"))
                .group_by([*KEY, "key"]).agg(pl.col("peer_node_s").min(), pl.len().alias("n"))
                .filter(pl.col("n") == 1).drop("n"))  # a short name that fits one node only
    # EC2's default host names spell the private address (`ip-10-1-33-7` is 10.1.33.7): a peer known
    # only by its address is that node when the job has it.
    by_ip = (nodes.with_columns(key=pl.col("node").str.to_lowercase()
                                .str.extract(r"^ip-(\d{1,3}-\d{1,3}-\d{1,3}-\d{1,3})(?:\.|$)").str.replace_all("-", "."))
             .filter(pl.col("key").is_not_null()).group_by([*KEY, "key"]).agg(pl.col("node").min().alias("peer_node_i"),
                                                                             pl.len().alias("n"))
             .filter(pl.col("n") == 1).drop("n"))
    out = symptoms.with_columns(_peer_key=_normalize_addr(pl.col("peer")))
    out = (out.join(addr, left_on=[*KEY, "_peer_key"], right_on=[*KEY, "key"], how="left", maintain_order="left")
           .join(by_name, left_on=[*KEY, "_peer_key"], right_on=[*KEY, "key"], how="left", maintain_order="left")
           .with_columns(_peer_short=_short_host(pl.col("_peer_key")))
           .join(by_short, left_on=[*KEY, "_peer_short"], right_on=[*KEY, "key"], how="left", maintain_order="left")
           .join(by_ip, left_on=[*KEY, "_peer_key"], right_on=[*KEY, "key"], how="left", maintain_order="left"))
    return out.with_columns(
        peer_node=pl.coalesce("peer_node_a", "peer_node_n", "peer_node_s", "peer_node_i"),
    ).drop("peer_node_a", "peer_node_n", "peer_node_s", "peer_node_i", "_peer_key", "_peer_short")


# Addresses that cannot name another node: link-local (an `fe80::...%ib0` or 169.254.x every host has),
# loopback, the unspecified address, and cut or redacted ones (`10.0.0.`, `10.1.*.*`, `<unknown>`,
# `xxxxxxxx`, `XXX.XXX.XXX.XXX`, `x.x.x.x`, `<hostname>`, `[REDACTED]`, a pasted placeholder such as
# `NODE2_IP` or `INFINIBAND-IP`: what people paste in place of their host names), and Docker's default
# bridge gateways (`172.17.0.1`, `172.18.0.1`, ...: the same address on every Docker host, so a peer known
# by it is "some host's bridge", no node).
_NOT_A_NODE = (r"(?i)^(?:\[?fe80:|169\.254\.|127\.|\[?::1\]?$|\[?::\]?$|localhost$|0\.0\.0\.0$|<?unknown>?$)"
               r"|%|\*|[.:]$|^\d{1,3}(?:\.\d{1,3}){0,2}$|^x+(?:\.x+){1,3}$|^172\.(?:1[7-9]|2\d|3[01])\.0\.1$"
               r"|^(?:x{3,}(?:[.\-_:]x+)*|#{3,}|<[a-z_\- ]+>|\[?redacted\]?|hidden)$"
               r"|(?-i:^(?:[A-Z0-9]+[_\-])*(?:IP|IPADDR|ADDR|ADDRESS|HOSTNAME)(?:[_\-][A-Z0-9]+)*$)")


def named_peer(peer: pl.Expr) -> pl.Expr:
    """A peer (or a line's own host) as a node name: the address or host itself without its port
    (`10.0.0.7<4242>`, `10.0.0.7:4242`, `[fd00::7]:4242`), unless it is one that cannot name a node
    (`_NOT_A_NODE`: link-local, loopback, cut, redacted)."""
    bare = (peer.str.replace(r"<\d+>$", "")
            .str.replace(r"^([^:\[\]]+):\d+$", "${1}")       # host:port / IPv4:port (one colon only)
            .str.replace(r"^\[([^\]]+)\]:\d+$", "${1}")      # [IPv6]:port
            .str.replace(r"^(?i:::ffff:)(\d{1,3}(?:\.\d{1,3}){3})$", "${1}"))  # IPv4-mapped: the IPv4 host
    return pl.when(bare.str.contains(_NOT_A_NODE)).then(None).otherwise(bare)


def normalize_pci(addr: pl.Expr) -> pl.Expr:
    """`00000000:3B:00.0` (nvidia-smi), `0000:3b:00` (Xid), `3b:00.0` (lspci) -> `0000:3b:00`: domain,
    bus and device, the way the driver names one GPU (the function is always 0 for a GPU)."""
    parts = addr.str.to_lowercase().str.extract_groups(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([0-9a-f]{2})(?:\.[0-7])?$")
    domain = parts.struct.field("1").fill_null("0").str.pad_start(8, "0").str.slice(4, 4)
    return pl.when(parts.struct.field("2").is_not_null()).then(
        pl.concat_str([domain, parts.struct.field("2"), parts.struct.field("3")], separator=":"))


def _nearest_header(symptoms: pl.DataFrame, specs: list[tuple[list[str], list[str], int, dict]]) -> pl.DataFrame:
    """Each line of a spec's `symptoms` with the nearest line of its `header_ids` above it in the same file,
    within `within` lines: one row per spec that reaches the line (file, seq, `_hseq` the header's seq, and
    the spec's `cols`, expressions over the header row)."""
    by = [*KEY, "file"]
    found = []
    for symptom_names, header_ids, within, cols in specs:
        fields = symptoms.filter(pl.col("symptom").is_in(symptom_names))
        if fields.height == 0:
            continue
        headers = (symptoms.filter(pl.col("rule_id").is_in(header_ids))
                   .select(*by, "seq", _hseq=pl.col("seq"), **cols).sort("seq"))
        found.append(fields.select(*by, "seq").unique().sort("seq")
                     .join_asof(headers, on="seq", by=by, strategy="backward", tolerance=within,
                                check_sortedness=False)  # sorted by seq above, within every group too
                     .filter(pl.col("_hseq").is_not_null()))
    return pl.concat(found) if found else pl.DataFrame()


def place_by_headers(symptoms: pl.DataFrame, ruleset: Ruleset) -> pl.DataFrame:
    """Blocks whose header names who: torchrun's failure summary entry (`host`, then `rank (local_rank)`,
    then `exitcode`/`traceback` lines), `kubectl describe node` (the hostname label, then the Conditions
    table). A block line knows only its own value; a header rule's `places` gives its node or rank to the
    lines of the named symptoms within its span below it in the same file, where they have none."""
    grouped: dict = {}
    for r in ruleset.rules:
        if r.places is not None:
            grouped.setdefault(r.places, []).append(r.id)
    cols = ("node", "rank", "peer")
    none = {"node": pl.lit(None, pl.String), "rank": pl.lit(None, symptoms.schema["rank"]), "peer": pl.lit(None, pl.String)}
    found = _nearest_header(symptoms, [
        (list(p.symptoms), ids, p.within, {f"_h{c}": pl.col(c) if c in p.gives else none[c] for c in cols})
        for p, ids in grouped.items()])
    if found.height == 0:
        return symptoms
    by = [*KEY, "file"]
    # A line under two headers (a pod's description after a node's) belongs to the nearer one.
    place = found.group_by([*by, "seq"]).agg(
        *[pl.col(c).filter(pl.col(c).is_not_null()).sort_by(pl.col("_hseq").filter(pl.col(c).is_not_null()))
          .last() for c in ("_hnode", "_hrank", "_hpeer")])
    out = symptoms.join(place, on=[*by, "seq"], how="left", maintain_order="left")
    # node and rank fill what the line lacks; a header's peer names the line's peer better than its own.
    return out.with_columns(node=pl.coalesce("node", "_hnode"), rank=pl.coalesce("rank", "_hrank"),
                            peer=pl.coalesce("_hpeer", "peer")).drop("_hnode", "_hrank", "_hpeer")


def set_roles_by_section(symptoms: pl.DataFrame, ruleset: Ruleset) -> pl.DataFrame:
    """Sections whose header says what their lines are: torchrun's failure summary lists `Failures:`
    (other workers: those it stopped after the first failure, SIGTERM then SIGKILL 30 s later, among
    them) before `Root Cause (first observed failure):`. A line of a section's symptoms takes the role and
    implicates of the nearest section header above it in the same file; a header with neither leaves lines
    as they are."""
    if symptoms.height == 0:
        return symptoms
    found = _nearest_header(symptoms, [
        (list(r.section.symptoms), [r.id], r.section.within,
         {"_hrole": pl.lit(r.section.role or None, pl.String), "_himp": pl.lit(r.section.implicates or None, pl.String)})
        for r in ruleset.rules if r.section is not None])
    if found.height == 0:
        return symptoms
    by = [*KEY, "file"]
    nearest = found.sort("_hseq").group_by([*by, "seq"]).agg(pl.col("_hrole", "_himp").last())
    out = symptoms.join(nearest, on=[*by, "seq"], how="left", maintain_order="left")
    return out.with_columns(role=pl.coalesce("_hrole", "role"), implicates=pl.coalesce("_himp", "implicates")
                            ).drop("_hrole", "_himp")


def set_aside_recovered(symptoms: pl.DataFrame, ruleset: Ruleset, progress: pl.DataFrame | None) -> pl.DataFrame:
    """A `recoverable` anomaly (one NaN loss or grad-norm warning) that the same file shows training
    progress after (a finite loss, `progress`: job x file -> last such line) was survived: context."""
    ids = [r.id for r in ruleset.rules if r.recoverable]
    if progress is None or progress.height == 0 or not ids or symptoms.height == 0:
        return symptoms
    out = symptoms.join(progress, on=[*KEY, "file"], how="left", maintain_order="left")
    survived = pl.col("rule_id").is_in(ids) & (pl.col("last_progress") > pl.col("seq")).fill_null(False)
    return out.with_columns(superseded_by=pl.when(survived & pl.col("superseded_by").is_null())
                            .then(pl.lit("recovered: training went on")).otherwise(pl.col("superseded_by"))
                            ).drop("last_progress")


def set_aside_refuted(symptoms: pl.DataFrame, ruleset: Ruleset) -> pl.DataFrame:
    """A `refuted_by_ranks` line (a job script's `python: command not found`: nothing started) that a rank's
    line follows in the same file (`[rank3]:`, srun's `3:` label, a local rank) is refuted: the program did
    start, so whatever the line's command was, it did not stop the job. Ranks are read from the matched lines
    themselves: a rank that printed nothing a rule reads refutes nothing."""
    ids = [r.id for r in ruleset.rules if r.refuted_by_ranks]
    if not ids or symptoms.height == 0:
        return symptoms
    by = [*KEY, "file"]
    claims = symptoms.filter(pl.col("rule_id").is_in(ids)).select(by).unique()
    if claims.height == 0:  # the usual case: look at no other row
        return symptoms
    ranked = (symptoms.join(claims, on=by, how="semi")
              .filter(pl.col("rank").is_not_null() | pl.col("local_rank").is_not_null())
              .group_by(by).agg(_last_ranked=pl.col("seq").max()))
    if ranked.height == 0:
        return symptoms
    out = symptoms.join(ranked, on=by, how="left", maintain_order="left")
    refuted = (pl.col("rule_id").is_in(ids) & pl.col("rank").is_null() & pl.col("local_rank").is_null()
               & (pl.col("_last_ranked") > pl.col("seq")).fill_null(False))
    return out.with_columns(superseded_by=pl.when(refuted & pl.col("superseded_by").is_null())
                            .then(pl.lit("refuted: a rank printed after it, so the program started"))
                            .otherwise(pl.col("superseded_by"))).drop("_last_ranked")


def set_aside_resolved(symptoms: pl.DataFrame, ruleset: Ruleset) -> pl.DataFrame:
    """A `resolved_by` outage (`nfs: server X not responding`) that a later line of the same file says is
    over (`nfs: server X OK`, with the captures in `same` equal) was survived: set aside, not a cause. An
    outage with no such line after it, or a new one after the recovery, stays."""
    rules = [(r.id, r.resolved_by) for r in ruleset.rules if r.resolved_by is not None]
    if not rules or symptoms.height == 0:
        return symptoms
    by = [*KEY, "file"]
    out = symptoms.with_row_index("_row")
    hit = []
    for rid, res in rules:
        outage = out.filter((pl.col("rule_id") == rid) & pl.col("superseded_by").is_null())
        if outage.height == 0:
            continue
        ends = out.filter(pl.col("symptom").is_in(list(res.symptoms))).select(
            *by, _eseq="seq", _ecap="captures")
        pairs = outage.select("_row", *by, "seq", "captures").join(ends, on=by).filter(pl.col("_eseq") > pl.col("seq"))
        for c in res.same:
            mine, theirs = (pl.col(col).str.json_path_match(f"$.{c}") for col in ("captures", "_ecap"))
            pairs = pairs.filter((mine == theirs).fill_null(False))
        hit.append(pairs.select("_row"))
    if not hit:
        return symptoms
    rows = pl.concat(hit).unique().with_columns(_resolved=pl.lit(True))
    out = out.join(rows, on="_row", how="left", maintain_order="left")
    return out.with_columns(superseded_by=pl.when(pl.col("_resolved").fill_null(False) & pl.col("superseded_by").is_null())
                            .then(pl.lit("resolved: a later line says it is over")).otherwise(pl.col("superseded_by"))
                            ).drop("_row", "_resolved")


def reread_at_startup(symptoms: pl.DataFrame, ruleset: Ruleset, progress: pl.DataFrame | None) -> pl.DataFrame:
    """A rule's `at_startup` outcome (summary, domain, action) replaces its own in a job that shows no
    training progress in any file: the same missing data file is a wrong path at start-up, not storage
    that failed mid-run. Without progress information (None) nothing is known, so nothing changes."""
    alt = {r.id: r.at_startup for r in ruleset.rules if r.at_startup is not None}
    if progress is None or not alt or symptoms.height == 0:
        return symptoms
    trained = progress.select(KEY).unique().with_columns(_trained=pl.lit(True))
    out = symptoms.join(trained, on=KEY, how="left", maintain_order="left")
    table = pl.DataFrame({"rule_id": list(alt), "_o": [a.outcome for a in alt.values()],
                          "_s": [a.summary or None for a in alt.values()], "_d": [a.domain or None for a in alt.values()],
                          "_a": [a.action or None for a in alt.values()]},
                         schema={"rule_id": pl.String, "_o": pl.String, "_s": pl.String, "_d": pl.String, "_a": pl.String})
    out = out.join(table, on="rule_id", how="left", maintain_order="left")
    start = pl.col("_o").is_not_null() & pl.col("_trained").is_null()
    return out.with_columns(
        outcome=pl.when(start).then(pl.col("_o")).otherwise(pl.col("outcome")),
        summary=pl.when(start).then(pl.coalesce("_s", "summary")).otherwise(pl.col("summary")),
        domain=pl.when(start).then(pl.coalesce("_d", "domain")).otherwise(pl.col("domain")),
        action=pl.when(start).then(pl.coalesce("_a", "action")).otherwise(pl.col("action")),
    ).drop("_trained", "_o", "_s", "_d", "_a")


ENDINGS = ("scheduler_timelimit",)  # what ends a job at the scheduler's word, whatever stopped it before
_FAULT_ROLES = ("root", "confirmation", "cascade")
_NOT_FAULTS = ("scheduler_timelimit", "scheduler_preemption_cancel", "healthy", "unknown")


def end_after_fault(symptoms: pl.DataFrame, progress: pl.DataFrame | None = None) -> pl.DataFrame:
    """A time limit that ends a job in which a fault showed before it (an IB completion error, a watchdog
    timeout: a job that had stopped and sat until the wall time) is how that job ended, not why: it becomes
    teardown. Before means earlier in the same file, or by timestamp; a fault that cannot be ordered
    against the limit (another file without times) does not count, since ranks print resets and timeouts
    after the limit's SIGTERM too. A configuration error that the same file shows training progress after
    (a job script's side command not found, then steps with a finite loss until the limit) did not stop the
    job: it is set aside and the limit stays the cause. Only configuration errors: a fabric or collective
    fault can be followed by a few steps of the ranks it has not reached yet before the job hangs."""
    if symptoms.height == 0:
        return symptoms
    live = pl.col("superseded_by").is_null()
    ends = (symptoms.filter(live & pl.col("outcome").is_in(ENDINGS) & (pl.col("role") == "root"))
            .select(*KEY, e_file="file", e_seq="seq", e_ts="ts"))
    if ends.height == 0:
        return symptoms
    if progress is not None and progress.height:
        went_on = (pl.col("outcome") == "config_error") & (pl.col("last_progress") > pl.col("seq")).fill_null(False)
        ended = ends.select(KEY).unique().with_columns(_ended=pl.lit(True))
        symptoms = (symptoms.join(progress, on=[*KEY, "file"], how="left", maintain_order="left")
                    .join(ended, on=KEY, how="left", maintain_order="left")
                    .with_columns(superseded_by=pl.when(live & went_on & pl.col("_ended").fill_null(False))
                                  .then(pl.lit("survived: training went on until the time limit"))
                                  .otherwise(pl.col("superseded_by")))
                    .drop("last_progress", "_ended"))
    faults = symptoms.filter(live & pl.col("role").is_in(_FAULT_ROLES) & ~pl.col("outcome").is_in(_NOT_FAULTS)
                             ).select(*KEY, "file", "seq", "ts")
    before = faults.join(ends, on=KEY).filter(
        ((pl.col("file") == pl.col("e_file")) & (pl.col("seq") < pl.col("e_seq"))).fill_null(False)
        | (pl.col("ts") < pl.col("e_ts")).fill_null(False))
    stopped = before.select(KEY).unique().with_columns(_stopped=pl.lit(True))
    out = symptoms.join(stopped, on=KEY, how="left", maintain_order="left")
    demote = pl.col("_stopped").fill_null(False) & pl.col("outcome").is_in(ENDINGS) & (pl.col("role") == "root")
    return out.with_columns(role=pl.when(demote).then(pl.lit("teardown")).otherwise(pl.col("role"))).drop("_stopped")


_STEP_TEARDOWN = ("slurm_step_cancelled", "slurm_step_aborted")


def cancel_without_fault(symptoms: pl.DataFrame, progress: pl.DataFrame | None = None) -> pl.DataFrame:
    """Slurm before 25.05 prints the same `*** STEP N CANCELLED AT T ***` whether srun tore the step down
    after one of its tasks failed or the step was cancelled from outside (scancel, preemption, an admin).
    A failed task shows before it (srun's `task N: Exited with exit code`, a traceback, an error); a step
    that was training (a loss line in the job) and shows nothing but the cancel and srun's abort before it,
    in no file, was cancelled from outside: the cancel is the root. Anything else the job printed that
    cannot be ordered after the cancel (another file) keeps it teardown."""
    if progress is None or progress.height == 0 or symptoms.height == 0:
        return symptoms
    live = pl.col("superseded_by").is_null()
    plain = (live & (pl.col("symptom") == "slurm_step_cancelled") & (pl.col("role") == "teardown")
             & pl.col("captures").str.json_path_match("$.task_failure").is_null())
    out = symptoms.with_row_index("_row")
    cancels = (out.filter(plain).select("_row", *KEY, c_file="file", c_seq="seq", c_ts="ts")
               .join(progress.select(KEY).unique(), on=KEY))
    if cancels.height == 0:
        return symptoms
    others = out.filter(live & (pl.col("role") != "context") & ~pl.col("symptom").is_in(_STEP_TEARDOWN)
                        ).select(*KEY, "file", "seq", "ts").join(cancels, on=KEY)
    after = (((pl.col("file") == pl.col("c_file")) & (pl.col("seq") > pl.col("c_seq")))
             | ((pl.col("file") != pl.col("c_file")) & (pl.col("ts") >= pl.col("c_ts")).fill_null(False)))
    spoilt = others.filter(~after).select("_row").unique()
    clean = cancels.join(spoilt, on="_row", how="anti").select("_row").with_columns(_clean=pl.lit(True))
    if clean.height == 0:
        return symptoms
    out = out.join(clean, on="_row", how="left", maintain_order="left").drop("_row")
    root = plain & pl.col("_clean").fill_null(False)
    return out.with_columns(
        role=pl.when(root).then(pl.lit("root")).otherwise(pl.col("role")),
        summary=pl.when(root).then(pl.col("summary") + pl.lit(" while it was training, with no failure before it "
                                                              "(cancelled from outside: scancel, preemption or an admin)"))
        .otherwise(pl.col("summary")),
    ).drop("_clean")


def refine(symptoms: pl.DataFrame, ruleset: Ruleset, progress: pl.DataFrame | None = None,
           stats: pl.DataFrame | None = None) -> pl.DataFrame:
    out = reread_at_startup(symptoms, ruleset, progress)
    out = supersede(set_roles_by_section(place_by_headers(out, ruleset), ruleset), ruleset)
    out = set_aside_resolved(set_aside_recovered(set_aside_by_order(out, ruleset), ruleset, progress), ruleset)
    out = set_aside_refuted(out, ruleset)
    out = resolve_peers(out, stats)
    out = cancel_without_fault(end_after_fault(out, progress), progress)
    # A line that names the guilty ranks ("[3, 11] joined but didn't finish") blames each of them.
    # A printed rank is a claim of the line: one no job can have (past limits.MAX_WORLD, 2^63) names nobody.
    named = pl.col("peer_rank").str.extract_all(r"\d+").list.eval(
        pl.element().cast(pl.Int64, strict=False)).list.eval(
        pl.when(pl.element() < MAX_WORLD).then(pl.element()).otherwise(None).cast(pl.Int32)).list.drop_nulls()
    out = out.with_columns(_named=pl.when(pl.col("implicates") == "peer").then(named)).explode("_named")
    return out.with_columns(
        target_rank=pl.when(pl.col("implicates") == "self").then(pl.col("rank"))
        .when(pl.col("implicates") == "peer").then(pl.col("_named")).otherwise(None),
    ).drop("_named").with_columns(
        tier=pl.col("role").replace_strict(ROLE_TIER, return_dtype=pl.Int8),
        # Who a row blames: the printer (self), the resolved peer, or nobody.
        target_node=pl.when(pl.col("implicates") == "self").then(named_peer(pl.col("node")))
        # A "peer" that is the printer's own host (NCCL's proxy socket to a process on the same node,
        # `Connection closed by remote peer <own fqdn>`) names no other node: the line stays evidence.
        .when((pl.col("implicates") == "peer")
              & (pl.coalesce("peer_node", named_peer(pl.col("peer"))) != pl.col("node")).fill_null(True))
        .then(pl.coalesce("peer_node", named_peer(pl.col("peer"))))
        .otherwise(None),
        target_gpu=pl.when(pl.col("implicates") == "self").then(pl.col("gpu")).otherwise(None),
        # A worker known only by its local rank (torchrun's `local_rank: 3`, `[default3]:`) is a culprit too.
        target_local_rank=pl.when(pl.col("implicates") == "self").then(pl.col("local_rank")).otherwise(None),
        # A GPU known by its PCI address (Xid, nvidia-smi, lspci) is a culprit GPU too.
        target_gpu_pci=pl.when(pl.col("implicates") == "self")
        .then(normalize_pci(pl.col("captures").str.json_path_match("$.gpu_pci"))).otherwise(None),
        peer_unresolved=(pl.col("implicates") == "peer") & pl.col("peer").is_not_null() & pl.col("peer_node").is_null(),
    )
