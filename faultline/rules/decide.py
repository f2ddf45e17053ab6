"""Phase 4, decide: outcome, culprit, affected, ambiguity and confidence for every job at once.

Per job, only the strongest tier present decides (root, then confirmation, cascade,
teardown; context never). Within it, candidate causes are the outcomes seen; the
earliest wins (timestamps within `skew_s` count as simultaneous); causes that are
simultaneous or cannot be ordered compete on rule priority, and when the best two are
within `band` of each other the verdict is ambiguous rather than a guess.
When only collective timeouts are seen, the culprit is inferred from who did *not*
report (the one silent rank) or who lags (the lowest last completed work).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from faultline.limits import MAX_WORLD
from faultline.rules.extract import KEY
from faultline.rules.refine import named_peer


@dataclass(frozen=True)
class DecideConfig:
    skew_s: float = 10.0  # clock-skew tolerance across nodes
    band: int = 10  # priorities this close cannot break a tie between causes
    # What a rank prints when it reports the hang (counts it as reporting, not silent): its own timeout or
    # progress, and the victims' lines that stand for one where the timeout itself is not printed: another
    # rank's error propagated through the store (torch 2.8+), a nonblocking init that timed out.
    hang_symptoms: tuple[str, ...] = ("nccl_watchdog_timeout", "nccl_watchdog_progress", "store_barrier_wait",
                                      "stalled_ready_ranks", "nccl_remote_error_signal", "nccl_nonblocking_timeout")
    max_world: int = MAX_WORLD  # ranks a job can have; larger printed world sizes are not believed
    # launcher lines naming the first process to fail: its rank (else its local rank) when the deciding
    # lines name nobody. mpirun's `Process name:` row; torchrun's agent line `failed (exitcode: 1)
    # local_rank: 3` (the earliest failure of its node) and its summary's `Root Cause` entry; Paddle's
    # `trainer process with rank=[3] was aborted`. Only rows
    # that blame their worker count: a SIGTERM/SIGABRT exit or an entry under `Failures:` does not.
    first_failure_symptoms: tuple[str, ...] = ("mpi_process_named", "torchrun_child_failed", "torchrun_failure_rank",
                                               "composer_rank_crashed",
                                               "paddle_trainer_aborted")
    # srun's `HOST: task N: Exited with exit code RC`: the node whose tasks exited on their own (the others
    # were signalled by srun's teardown), when exactly one node did
    first_failure_node_symptoms: tuple[str, ...] = ("slurm_task_exit_code",)
    # verdicts whose first process to fail is a victim: in a hang the first to exit is the first to time out
    first_failure_not_for: tuple[str, ...] = ("nccl_timeout_hang",)


def _cap(name: str) -> pl.Expr:
    return pl.col("captures").str.json_path_match(f"$.{name}")


def candidates(active: pl.DataFrame, cfg: DecideConfig) -> pl.DataFrame:
    """One row per job x outcome of the deciding tier, ranked; `rank_in_job` 1 is the winner."""
    tol = pl.duration(microseconds=int(cfg.skew_s * 1e6))
    deciding = active.filter(pl.col("tier") == pl.col("tier").min().over(KEY))
    # The row that speaks for each outcome: highest priority, then earliest.
    ordered = deciding.sort([*KEY, "outcome", "priority", "ts", "file", "seq"],
                            descending=[False] * 4 + [True, False, False, False], nulls_last=True)
    cand = ordered.group_by([*KEY, "outcome"], maintain_order=True).agg(
        t=pl.col("ts").min(),
        p=pl.col("priority").max(),
        n=pl.len(),
        rule_id=pl.col("rule_id").first(),
        role=pl.col("role").first(),
        domain=pl.col("domain").first(),
        action=pl.col("action").first(),
        nodes=pl.col("target_node").drop_nulls().unique().sort(),
    )
    cand = cand.with_columns(t_min=pl.col("t").min().over(KEY))
    cand = cand.with_columns(
        contender=pl.col("t").is_null() | pl.col("t_min").is_null() | (pl.col("t") <= pl.col("t_min") + tol))
    cand = cand.with_columns(best_p=pl.col("p").filter(pl.col("contender")).max().over(KEY))
    # Winner: a contender of the best priority, earliest, then by name (deterministic).
    cand = cand.sort([*KEY, "contender", "p", "t", "outcome"],
                     descending=[False, False, False, True, True, False, False], nulls_last=True)
    cand = cand.with_columns(rank_in_job=pl.int_range(1, pl.len() + 1).over(KEY))
    cand = cand.with_columns(
        close=pl.col("contender") & (pl.col("p") >= pl.col("best_p") - cfg.band) & (pl.col("rank_in_job") > 1))
    return cand.with_columns(ambiguous=pl.col("close").any().over(KEY))


def culprits(active: pl.DataFrame, winners: pl.DataFrame, cfg: DecideConfig) -> pl.DataFrame:
    """Culprit nodes/ranks/GPUs of each winning outcome: the targets whose first evidence is
    within the skew tolerance of the outcome's first evidence."""
    tol = pl.duration(microseconds=int(cfg.skew_s * 1e6))
    rows = active.join(winners.select(*KEY, "outcome", t_win="t"), on=[*KEY, "outcome"])
    rows = rows.filter(pl.col("tier") == pl.col("tier").min().over(KEY))
    # A GPU index alone (no host, no rank) says where a workload fault struck (`GPU 1 has a total
    # capacity of ...`); for a machine fault it would name a GPU on an unknown node: not a culprit, unless
    # the job's lines name no host at all and show no other (`hostless`: one machine's pasted output, a
    # DCGM diag or nvidia-smi report of the GPU that failed there).
    hostless = pl.col("hostless").fill_null(False) if "hostless" in rows.columns else pl.lit(False)
    gpu_only = pl.col("target_gpu").is_not_null() & ((pl.col("domain") == "workload")
                                                     | ((pl.col("domain") == "hardware") & hostless))
    blamed = rows.filter(pl.col("target_node").is_not_null() | pl.col("target_rank").is_not_null()
                         | pl.col("target_gpu_pci").is_not_null() | pl.col("target_local_rank").is_not_null()
                         | gpu_only)
    first = blamed.group_by([*KEY, "target_node", "target_rank", "target_local_rank", "target_gpu",
                             "target_gpu_pci"]).agg(
        t=pl.col("ts").min(), unresolved=pl.col("peer_unresolved").any(), inferred=pl.col("node_inferred").all())
    first = first.join(winners.select(*KEY, t_win="t"), on=KEY).filter(
        pl.col("t").is_null() | pl.col("t_win").is_null() | (pl.col("t") <= pl.col("t_win") + tol))
    return first.group_by(KEY).agg(
        culprit_nodes=pl.col("target_node").drop_nulls().unique().sort(),
        culprit_ranks=pl.col("target_rank").drop_nulls().unique().sort(),
        culprit_gpus=pl.col("target_gpu").drop_nulls().unique().sort(),
        culprit_gpu_pci=pl.col("target_gpu_pci").drop_nulls().unique().sort(),
        # local ranks only where no global rank says more
        culprit_local_ranks=pl.col("target_local_rank").filter(pl.col("target_rank").is_null()).drop_nulls().unique().sort(),
        peer_unresolved=pl.col("unresolved").any(),
        node_inferred=(pl.col("inferred") & pl.col("target_node").is_not_null()).any(),
    )


MAX_SINGLE_HOST_RANKS = 8  # one host's GPUs: more ranks than this cannot all live on one node


def active_symptoms(refined: pl.DataFrame, stats: pl.DataFrame) -> pl.DataFrame:
    """What can decide: not superseded, not context; lines without a host placed where that is sure."""
    return place_on_single_host(
        refined.filter(pl.col("superseded_by").is_null() & (pl.col("role") != "context")), stats)


def single_host(stats: pl.DataFrame, named: pl.DataFrame | None = None) -> pl.DataFrame:
    """Jobs whose lines name exactly one host, with no more ranks than one host holds: the host. `named`
    (job key, node) adds the hosts the matched lines name in their message (`srun: error: gpu7: ...`)."""
    if named is not None and named.height:
        stats = pl.concat([stats.select(*KEY, "node", "rank"),
                           named.select(*KEY, "node", pl.lit(None).cast(stats.schema["rank"]).alias("rank"))
                           .cast({"node": stats.schema["node"]})], how="vertical")
    return (stats.group_by(KEY).agg(nodes=pl.col("node").drop_nulls().unique(),
                                    top_rank=pl.col("rank").drop_nulls().max())
            .filter((pl.col("nodes").list.len() == 1)
                    & (pl.col("top_rank").is_null() | (pl.col("top_rank") < MAX_SINGLE_HOST_RANKS)))
            .select(*KEY, only_node=pl.col("nodes").list.first()))


def place_on_single_host(active: pl.DataFrame, stats: pl.DataFrame) -> pl.DataFrame:
    """A hardware line that blames its printer but carries no host (`CUDA error: uncorrectable ECC` with
    no prefix) was printed on the job's one host when every line that names a host names the same one.
    Only hardware faults, and only in jobs with no sign of other hosts (a peer named, a network fault):
    a pasted excerpt often shows one node's lines of a many-node job, and the fault may be elsewhere.
    Host memory exhaustion too (`Detected 1 oom-kill event(s)`, the kernel's OOM kill): a workload fault,
    but one that struck on the host where the process ran, which then is where to look; never drained.
    And a node failure its printer reports of itself (Ray's raylet `mistakenly been marked dead`, in the
    raylet log of the host the pasted prompt names)."""
    others = (active.filter((pl.col("implicates") == "peer") | (pl.col("domain") == "network"))
              .select(KEY).unique().with_columns(_others=pl.lit(True)))
    named = active.select(*KEY, node=named_peer(pl.col("node"))).filter(pl.col("node").is_not_null())
    # jobs whose lines name no host at all, in any prefix or message
    hosted = pl.concat([stats.filter(pl.col("node").is_not_null()).select(KEY),
                        named.select(KEY)], how="vertical").unique().with_columns(_hosted=pl.lit(True))
    out = (active.join(single_host(stats, named), on=KEY, how="left", maintain_order="left")
           .join(others, on=KEY, how="left", maintain_order="left")
           .join(hosted, on=KEY, how="left", maintain_order="left"))
    placeable = (pl.col("domain") == "hardware") | pl.col("outcome").is_in(["host_oom", "node_failure"])
    fill = ((pl.col("implicates") == "self") & placeable & pl.col("target_node").is_null()
            & pl.col("only_node").is_not_null() & pl.col("_others").is_null())
    return out.with_columns(target_node=pl.when(fill).then(pl.col("only_node")).otherwise(pl.col("target_node")),
                            node_inferred=fill,
                            hostless=pl.col("_hosted").is_null() & pl.col("_others").is_null()
                            ).drop("only_node", "_others", "_hosted")


def _pg() -> pl.Expr:
    """The process group a watchdog line speaks of (`[PG 1 Rank 0]`, `[PG ID 1 PG GUID 1(tp) Rank 0]`), `-`
    when its prefix names none (older PyTorch, or the default group)."""
    return pl.coalesce(_cap("pg"), pl.col("line").str.extract(r"\[PG (?:ID )?(\d+)[^\]]{0,80}? Rank \d+\]"),
                       pl.lit("-"))


def odd_op_ranks(hang: pl.DataFrame) -> pl.DataFrame:
    """Per job, the one rank whose watchdog timed out at the same SeqNum of a process group as the
    others but in another collective (`BROADCAST` where the rest wait in `ALLREDUCE`): it took a code
    path the others did not, and they wait on it. Only an odd one out counts: two ops with one rank
    against two or more, one such rank in the job. SeqNums count per process group, so a line with a
    PG id or a group-local rank unlike its global rank is compared only within its group."""
    rows = (hang.select(*KEY, "rank", seq=_cap("seq").cast(pl.Int64, strict=False), op=_cap("op"),
                        pg=_pg(), pg_rank=_cap("pg_rank").cast(pl.Int32, strict=False))
            .filter(pl.col("seq").is_not_null() & pl.col("op").is_not_null() & pl.col("rank").is_not_null()
                    & (pl.col("pg_rank").is_null() | (pl.col("pg_rank") == pl.col("rank"))))
            .unique(subset=[*KEY, "pg", "seq", "rank", "op"]))
    grp = [*KEY, "pg", "seq"]
    # a rank seen in two ops at one SeqNum says nothing
    rows = rows.filter(pl.col("op").n_unique().over([*grp, "rank"]) == 1)
    ops = rows.group_by([*grp, "op"]).agg(ranks=pl.col("rank").unique(), n=pl.len())
    ops = ops.with_columns(n_ops=pl.len().over(grp), others=pl.col("n").sum().over(grp) - pl.col("n"))
    odd = ops.filter((pl.col("n_ops") == 2) & (pl.col("n") == 1) & (pl.col("others") >= 2))
    return (odd.explode("ranks").group_by(KEY).agg(odd_op=pl.col("ranks").unique().sort())
            .filter(pl.col("odd_op").list.len() == 1))


def ahead_ranks(hang: pl.DataFrame) -> pl.DataFrame:
    """Per job, the one rank of a process group whose watchdog timed out past the collective all the
    others wait in, and in another collective (`_ALLGATHER_BASE` at SeqNum 102 where two or more others
    wait in `BROADCAST` at 100). In step it could not have finished the work they are still in: it took
    a code path they did not (desync), and they wait on it. Only an odd one out counts: two positions in
    the group, one rank at the higher one against two or more at the other, in different ops."""
    rows = (hang.select(*KEY, "rank", seq=_cap("seq").cast(pl.Int64, strict=False), op=_cap("op"),
                        pg=_pg(), pg_rank=_cap("pg_rank").cast(pl.Int32, strict=False))
            .filter(pl.col("seq").is_not_null() & pl.col("op").is_not_null() & pl.col("rank").is_not_null()
                    & (pl.col("pg_rank").is_null() | (pl.col("pg_rank") == pl.col("rank"))))
            .unique(subset=[*KEY, "pg", "seq", "rank", "op"]))
    grp = [*KEY, "pg"]
    # a rank seen at two positions of one group says nothing
    rows = rows.filter(pl.len().over([*grp, "rank"]) == 1)
    pos = rows.group_by([*grp, "seq", "op"]).agg(ranks=pl.col("rank").unique(), n=pl.len())
    pos = pos.with_columns(n_pos=pl.len().over(grp), n_ops=pl.col("op").n_unique().over(grp),
                           others=pl.col("n").sum().over(grp) - pl.col("n"),
                           top=pl.col("seq").max().over(grp))
    odd = pos.filter((pl.col("n_pos") == 2) & (pl.col("n_ops") == 2) & (pl.col("n") == 1)
                     & (pl.col("others") >= 2) & (pl.col("seq") == pl.col("top")))
    return (odd.explode("ranks").group_by(KEY).agg(ahead=pl.col("ranks").unique().sort())
            .filter(pl.col("ahead").list.len() == 1))


def infer_hang(active: pl.DataFrame, stats: pl.DataFrame, cfg: DecideConfig) -> pl.DataFrame:
    """Per job: the ranks that did not report a collective timeout while the others did, and
    the ranks whose last completed work lags. Columns: silent_seen, silent_unseen, laggards."""
    hang = active.filter(pl.col("symptom").is_in(list(cfg.hang_symptoms)))
    if hang.height == 0:
        return pl.DataFrame(schema={**{k: active.schema[k] for k in KEY}, "silent_seen": pl.List(pl.Int32),
                                    "silent_unseen": pl.List(pl.Int32), "laggards": pl.List(pl.Int32),
                                    "odd_op": pl.List(pl.Int32), "ahead": pl.List(pl.Int32),
                                    "suspect_nodes": pl.List(pl.String)})
    # A stall report that lists the ranks which reached the collective (Horovod's `[ready ranks: 5, 1, 0]`)
    # speaks for them: they count as reporting, so the ranks left out of it are the silent ones.
    said_ready = (hang.select(*KEY, rank=_cap("ready_ranks").str.extract_all(r"\d+"))
                  .explode("rank").drop_nulls("rank")
                  .with_columns(pl.col("rank").cast(hang.schema["rank"], strict=False)))
    reporting = (pl.concat([hang.select(*KEY, "rank"), said_ready], how="vertical").group_by(KEY)
                 .agg(reporting=pl.col("rank").drop_nulls().unique())
                 .join(hang.group_by(KEY).agg(world=_cap("world_size").cast(pl.Int32, strict=False).max()), on=KEY))
    seen = stats.filter(pl.col("rank").is_not_null()).group_by(KEY).agg(seen=pl.col("rank").unique())
    # Last completed work: the watchdog's own report, or one before the SeqNum a rank timed out at
    # (ranks out of step time out at different SeqNums; the lowest is behind). Work numbers count per
    # process group: compared only within one (a sub-group's work 40 is not behind the default group's 1580).
    progress = (hang.with_columns(lc=pl.coalesce(_cap("last_completed").cast(pl.Int64, strict=False),
                                                 _cap("seq").cast(pl.Int64, strict=False) - 1), pg=_pg())
                .filter(pl.col("lc").is_not_null() & pl.col("rank").is_not_null())
                .group_by([*KEY, "pg", "rank"]).agg(pl.col("lc").max()))
    # Those behind must not outnumber those ahead: two ranks waiting where a third has gone on are the
    # ones in step, the third left them (see `ahead_ranks`).
    lag = (progress.with_columns(lo=pl.col("lc").min().over([*KEY, "pg"]), hi=pl.col("lc").max().over([*KEY, "pg"]))
           .with_columns(n_lo=(pl.col("lc") == pl.col("lo")).sum().over([*KEY, "pg"]), n=pl.len().over([*KEY, "pg"]))
           .filter((pl.col("lc") == pl.col("lo")) & (pl.col("lo") < pl.col("hi")) & (pl.col("n_lo") * 2 <= pl.col("n")))
           .group_by(KEY).agg(laggards=pl.col("rank").unique().sort()))
    # All completed the same work: the rank that did not even enqueue the next one (its last enqueued
    # is lower: it never reached the collective the others wait in, stuck on its own side) is behind.
    # Work numbers count per process group: compared within one.
    enq = (hang.with_columns(le=_cap("last_enqueued").cast(pl.Int64, strict=False),
                             lc=_cap("last_completed").cast(pl.Int64, strict=False), pg=_pg())
           .filter(pl.col("le").is_not_null() & pl.col("lc").is_not_null() & pl.col("rank").is_not_null())
           .group_by([*KEY, "pg", "rank"]).agg(pl.col("le").max(), pl.col("lc").max()))
    by_pg = [*KEY, "pg"]
    lag_e = (enq.with_columns(lc_lo=pl.col("lc").min().over(by_pg), lc_hi=pl.col("lc").max().over(by_pg),
                              lo=pl.col("le").min().over(by_pg), hi=pl.col("le").max().over(by_pg))
             .filter((pl.col("lc_lo") == pl.col("lc_hi")) & (pl.col("le") == pl.col("lo")) & (pl.col("lo") < pl.col("hi")))
             .group_by(KEY).agg(laggards_e=pl.col("rank").unique().sort()))
    lag = (lag.join(lag_e, on=KEY, how="full", coalesce=True)
           .select(*KEY, laggards=pl.coalesce(pl.when(pl.col("laggards").list.len() > 0).then("laggards"), "laggards_e")))
    out = reporting.join(seen, on=KEY, how="left").with_columns(
        seen=pl.col("seen").fill_null(pl.lit([], pl.List(pl.Int32))))
    # Ranks are numbered 0..world-1: the world size, or else a hole below the highest rank
    # seen, names a rank that never spoke.
    # Bounded: a world size or rank is a number a line printed, never a size to allocate by.
    top = pl.min_horizontal(pl.max_horizontal(pl.col("world").fill_null(0),
                                              pl.col("seen").list.concat("reporting").list.max().fill_null(-1) + 1),
                            pl.lit(cfg.max_world))
    out = out.with_columns(expected=pl.int_ranges(0, top, dtype=pl.Int32))
    out = out.with_columns(
        silent_seen=pl.col("seen").list.set_difference("reporting").list.sort(),
        silent_unseen=pl.col("expected").list.set_difference(pl.col("seen").list.concat("reporting")).list.sort(),
    )
    # Ranks sit on nodes in contiguous blocks (node_rank * ranks_per_node + local_rank): a silent
    # rank inside the block of a node that kept logging lives on a node that is up, so it hung.
    blocks = (stats.filter(pl.col("node").is_not_null() & pl.col("rank").is_not_null())
              .group_by([*KEY, "node"]).agg(lo=pl.col("rank").min(), hi=pl.col("rank").max()))
    covered = (out.select(*KEY, r=pl.col("silent_unseen")).explode("r").drop_nulls("r")
               .join(blocks, on=KEY).filter((pl.col("r") >= pl.col("lo")) & (pl.col("r") <= pl.col("hi")))
               .group_by(KEY).agg(covered=pl.col("r").unique()))
    out = out.join(covered, on=KEY, how="left").with_columns(
        pl.col("covered").fill_null(pl.lit([], pl.List(pl.Int32))))
    out = out.with_columns(
        silent_seen=pl.col("silent_seen").list.concat("covered").list.unique().list.sort(),
        silent_unseen=pl.col("silent_unseen").list.set_difference("covered").list.sort())
    out = out.join(lag, on=KEY, how="left").with_columns(pl.col("laggards").fill_null(pl.lit([], pl.List(pl.Int32))))
    out = out.join(odd_op_ranks(hang), on=KEY, how="left").with_columns(
        pl.col("odd_op").cast(pl.List(pl.Int32)).fill_null(pl.lit([], pl.List(pl.Int32))))
    out = out.join(ahead_ranks(hang), on=KEY, how="left").with_columns(
        pl.col("ahead").cast(pl.List(pl.Int32)).fill_null(pl.lit([], pl.List(pl.Int32))))
    # Where the suspects live: a line that carried both their rank and a node, or their node's block.
    suspects = (out.select(*KEY, r=pl.col("silent_seen").list.concat("laggards").list.concat("odd_op")
                           .list.concat("ahead"))
                .explode("r").drop_nulls("r"))
    known = stats.filter(pl.col("node").is_not_null() & pl.col("rank").is_not_null()).select(*KEY, "node", r="rank")
    direct = suspects.join(known, on=[*KEY, "r"])
    in_block = suspects.join(blocks, on=KEY).filter((pl.col("r") >= pl.col("lo")) & (pl.col("r") <= pl.col("hi")))
    homes = (pl.concat([direct.select(*KEY, "r", "node"), in_block.select(*KEY, "r", "node")])
             .unique().group_by(KEY).agg(suspect_nodes=pl.col("node").unique().sort()))
    return out.join(homes, on=KEY, how="left").select(
        *KEY, "silent_seen", "silent_unseen", "laggards", "odd_op", "ahead",
        suspect_nodes=pl.col("suspect_nodes").fill_null(pl.lit([], pl.List(pl.String))))


_LOST_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "lost": pl.List(pl.String)}


def lost_telemetry(coverage: pl.DataFrame | None) -> pl.DataFrame:
    """Per job, the log sources that were asked for and failed (coverage `error`), with why.

    Only failures count: an empty syslog is what a healthy node prints, and a source nobody
    configured was never part of the picture."""
    if coverage is None:
        return pl.DataFrame(schema=_LOST_SCHEMA)
    return (coverage.filter((pl.col("source") != "scheduler") & (pl.col("status") == "error"))
            .sort([*KEY, "source"])
            .group_by(KEY, maintain_order=True)
            .agg(lost=pl.format("{} ({})", "source", pl.col("reason").fill_null("").str.slice(0, 160)))
            .cast(_LOST_SCHEMA))


def decide(refined: pl.DataFrame, stats: pl.DataFrame, jobs: pl.DataFrame,
           cfg: DecideConfig = DecideConfig(), coverage: pl.DataFrame | None = None) -> pl.DataFrame:
    """One verdict row per job of `jobs` (key, state); see module doc for the logic. `coverage`
    (job x source status) lowers confidence where a log source failed (`lost_telemetry`)."""
    active = active_symptoms(refined, stats)
    cand = candidates(active, cfg)
    winners = cand.filter(pl.col("rank_in_job") == 1)
    blame = culprits(active, winners, cfg)
    hang = infer_hang(active, stats, cfg)
    confirmed = (refined.filter((pl.col("role") == "confirmation") & pl.col("superseded_by").is_null())
                 .select(*KEY, "outcome").unique().with_columns(confirmed=pl.lit(True)))
    verdict = (jobs.select(*KEY, "state")
               .join(winners.select(*KEY, "outcome", "role", "domain", "action", "rule_id", "p", "t",
                                    "ambiguous"), on=KEY, how="left")
               .join(blame, on=KEY, how="left")
               .join(hang, on=KEY, how="left")
               .join(confirmed, on=[*KEY, "outcome"], how="left"))
    empty_i = pl.lit([], pl.List(pl.Int32))
    verdict = verdict.with_columns(
        culprit_nodes=pl.col("culprit_nodes").fill_null(pl.lit([], pl.List(pl.String))),
        culprit_ranks=pl.col("culprit_ranks").fill_null(empty_i),
        culprit_gpus=pl.col("culprit_gpus").fill_null(empty_i),
        culprit_gpu_pci=pl.col("culprit_gpu_pci").fill_null(pl.lit([], pl.List(pl.String))),
        culprit_local_ranks=pl.col("culprit_local_ranks").fill_null(empty_i),
        silent_seen=pl.col("silent_seen").fill_null(empty_i),
        silent_unseen=pl.col("silent_unseen").fill_null(empty_i),
        laggards=pl.col("laggards").fill_null(empty_i),
        odd_op=pl.col("odd_op").fill_null(empty_i),
        ahead=pl.col("ahead").fill_null(empty_i),
        suspect_nodes=pl.col("suspect_nodes").fill_null(pl.lit([], pl.List(pl.String))),
        peer_unresolved=pl.col("peer_unresolved").fill_null(False),
        node_inferred=pl.col("node_inferred").fill_null(False),
        confirmed=pl.col("confirmed").fill_null(False),
        ambiguous=pl.col("ambiguous").fill_null(False),
    )
    # Hang with no direct blame: the one silent rank that kept logging, else the one rank in another
    # collective at the same SeqNum (the lines show it; a rank that printed nothing may only be cut
    # out of a pasted excerpt), else the one silent rank that printed nothing, else the laggards.
    is_hang = (pl.col("outcome") == "nccl_timeout_hang") & (pl.col("role") != "root") & (pl.col("culprit_ranks").list.len() == 0) & (pl.col("culprit_nodes").list.len() == 0)
    silent = pl.col("silent_seen").list.concat("silent_unseen")
    verdict = verdict.with_columns(
        inference=pl.when(is_hang & (silent.list.len() == 1) & (pl.col("silent_unseen").list.len() == 0))
        .then(pl.lit("silent_seen"))
        .when(is_hang & (pl.col("odd_op").list.len() == 1)).then(pl.lit("odd_op"))
        .when(is_hang & (silent.list.len() == 1)).then(pl.lit("silent_unseen"))
        .when(is_hang & (silent.list.len() == 0) & (pl.col("laggards").list.len() > 0)
              & (pl.col("laggards").list.len() <= 2)).then(pl.lit("laggard"))
        .when(is_hang & (silent.list.len() == 0) & (pl.col("ahead").list.len() == 1)).then(pl.lit("ahead"))
        .otherwise(pl.lit(None, pl.String)),
    )
    verdict = verdict.with_columns(
        culprit_ranks=pl.when(pl.col("inference").is_in(["silent_seen", "silent_unseen"])).then(silent)
        .when(pl.col("inference") == "laggard").then(pl.col("laggards"))
        .when(pl.col("inference") == "odd_op").then(pl.col("odd_op"))
        .when(pl.col("inference") == "ahead").then(pl.col("ahead"))
        .otherwise(pl.col("culprit_ranks")),
        # the node the inferred rank lives on, when the logs say (a hang there; not a hardware verdict)
        culprit_nodes=pl.when(pl.col("inference").is_in(["silent_seen", "laggard", "odd_op", "ahead"])
                              & (pl.col("suspect_nodes").list.len() == 1))
        .then(pl.col("suspect_nodes")).otherwise(pl.col("culprit_nodes")),
        # A rank that printed nothing at all may sit on a dead node: say so, don't choose.
        ambiguous=pl.col("ambiguous") | (pl.col("inference") == "silent_unseen").fill_null(False),
    )
    # A cause whose lines name nobody (an exception printed without a rank tag) and a launcher that names
    # the first process to fail (mpirun's `Process name: [[jobid,1],N]`): that rank, at lower confidence.
    # Read from every refined row, context included: the summary's rank row is context (it decides nothing).
    # A worker known only by its local rank counts when the launcher rows of the job name one local rank on
    # at most one node (each node's agent reports its own first failure: two nodes, two first failures).
    said = refined.filter(pl.col("superseded_by").is_null() & (pl.col("implicates") == "self")
                          & pl.col("symptom").is_in([*cfg.first_failure_symptoms, *cfg.first_failure_node_symptoms]))
    by_node = pl.col("symptom").is_in(list(cfg.first_failure_node_symptoms))
    first = (said.group_by(KEY).agg(
        first_ranks=pl.col("target_rank").filter(~by_node).drop_nulls().unique().sort(),
        first_local=pl.col("target_local_rank").filter(~by_node & pl.col("target_rank").is_null()).drop_nulls().unique().sort(),
        first_nodes=pl.col("node").filter(~by_node & pl.col("target_rank").is_null() & pl.col("target_local_rank").is_not_null())
        .drop_nulls().n_unique(),
        exit_nodes=pl.col("target_node").filter(by_node).drop_nulls().unique().sort()))
    nobody = ((pl.col("culprit_nodes").list.len() == 0) & (pl.col("culprit_ranks").list.len() == 0)
              & (pl.col("culprit_gpus").list.len() == 0) & (pl.col("culprit_gpu_pci").list.len() == 0)
              & (pl.col("culprit_local_ranks").list.len() == 0) & pl.col("inference").is_null()
              & ~pl.col("outcome").is_in(list(cfg.first_failure_not_for)).fill_null(False))
    one_rank = pl.col("first_ranks").list.len() == 1
    one_local = (pl.col("first_ranks").list.len() == 0) & (pl.col("first_local").list.len() == 1) & (pl.col("first_nodes") <= 1)
    one_node = ((pl.col("first_ranks").list.len() == 0) & (pl.col("first_local").list.len() == 0)
                & (pl.col("exit_nodes").list.len() == 1))
    # A workload cause whose line names only the GPU index it ran on (a CUDA OOM's `GPU 1 has a total
    # capacity ...`, printed without a rank tag) and a launcher that names one global rank as the first to
    # fail: that rank too. The GPU stays; the confidence is the line's own (the launcher adds, not guesses).
    gpu_only = ((pl.col("culprit_gpus").list.len() > 0) & (pl.col("culprit_nodes").list.len() == 0)
                & (pl.col("culprit_ranks").list.len() == 0) & (pl.col("culprit_gpu_pci").list.len() == 0)
                & (pl.col("culprit_local_ranks").list.len() == 0) & pl.col("inference").is_null()
                & (pl.col("domain") == "workload"))
    verdict = verdict.join(first, on=KEY, how="left").with_columns(
        launcher_named=(nobody & (one_rank | one_local | one_node)).fill_null(False), _by_rank=one_rank.fill_null(False),
        _by_node=one_node.fill_null(False), launcher_ranked=(gpu_only & one_rank).fill_null(False))
    verdict = verdict.with_columns(
        culprit_nodes=pl.when(pl.col("launcher_named") & pl.col("_by_node")).then(pl.col("exit_nodes"))
        .otherwise(pl.col("culprit_nodes")),
        culprit_ranks=pl.when((pl.col("launcher_named") & pl.col("_by_rank")) | pl.col("launcher_ranked"))
        .then(pl.col("first_ranks").cast(pl.List(pl.Int32)))
        .otherwise(pl.col("culprit_ranks")),
        culprit_local_ranks=pl.when(pl.col("launcher_named") & ~pl.col("_by_rank") & ~pl.col("_by_node"))
        .then(pl.col("first_local").cast(pl.List(pl.Int32))).otherwise(pl.col("culprit_local_ranks")),
    ).drop("first_ranks", "first_local", "first_nodes", "exit_nodes", "_by_rank", "_by_node")
    # A hang blamed on one rank by name (a desync report's `[3] joined but didn't finish`, a monitored barrier's
    # `Rank 3 failed to pass`) with no node: the node that rank's own lines were printed on, when they were
    # printed on exactly one (the same placement the inferred hang culprits get, from a line of that rank).
    homes = (stats.filter(pl.col("node").is_not_null() & pl.col("rank").is_not_null())
             .group_by([*KEY, "rank"]).agg(_homes=pl.col("node").unique())
             .filter(pl.col("_homes").list.len() == 1)
             .select(*KEY, _r=pl.col("rank").cast(pl.Int32), _home=pl.col("_homes").list.first()))
    named_hang = ((pl.col("outcome") == "nccl_timeout_hang") & pl.col("inference").is_null() & ~pl.col("launcher_named")
                  & (pl.col("culprit_nodes").list.len() == 0) & (pl.col("culprit_ranks").list.len() == 1))
    verdict = (verdict.with_columns(_r=pl.when(named_hang).then(pl.col("culprit_ranks").list.first()))
               .join(homes, on=[*KEY, "_r"], how="left")
               .with_columns(rank_homed=pl.col("_home").is_not_null(),
                             culprit_nodes=pl.when(pl.col("_home").is_not_null())
                             .then(pl.concat_list(pl.col("_home"))).otherwise(pl.col("culprit_nodes")))
               .drop("_r", "_home"))
    # A cause every node (or rank) reports is not in one place: NaN after the all-reduce, a missing
    # module on every rank, a switch under both nodes. Naming them all would blame the whole job.
    spread = stats.group_by(KEY).agg(n_nodes=pl.col("node").drop_nulls().n_unique(),
                                     n_ranks=pl.col("rank").drop_nulls().n_unique())
    verdict = verdict.join(spread, on=KEY, how="left")
    n_cul_nodes, n_cul_ranks = pl.col("culprit_nodes").list.len(), pl.col("culprit_ranks").list.len()
    # The winning cause seen on most of the job's nodes over time, not only on the first ones
    # (a health check failing node after node for two hours): a systemic fault, not one place.
    n_cause_nodes = pl.col("cause_nodes").list.len().fill_null(0)
    verdict = verdict.join(winners.select(*KEY, cause_nodes="nodes"), on=KEY, how="left")
    systemic = (n_cause_nodes >= 3) & (n_cause_nodes * 2 >= pl.col("n_nodes").fill_null(0))
    everywhere = (pl.when(systemic).then(True)
                  .when(n_cul_nodes == 1).then(False)  # one node is one place, however many ranks
                  .when(n_cul_ranks > 0).then((n_cul_ranks >= 2) & (n_cul_ranks * 2 >= pl.col("n_ranks").fill_null(0)))
                  .otherwise((n_cul_nodes >= 3) & (n_cul_nodes * 2 >= pl.col("n_nodes").fill_null(0))))
    verdict = verdict.with_columns(widespread=everywhere & pl.col("inference").is_null())
    verdict = verdict.with_columns(
        culprit_nodes=pl.when(pl.col("widespread")).then(pl.lit([], pl.List(pl.String))).otherwise("culprit_nodes"),
        culprit_ranks=pl.when(pl.col("widespread")).then(empty_i).otherwise("culprit_ranks"),
        culprit_gpus=pl.when(pl.col("widespread")).then(empty_i).otherwise("culprit_gpus"),
        culprit_gpu_pci=pl.when(pl.col("widespread")).then(pl.lit([], pl.List(pl.String))).otherwise("culprit_gpu_pci"),
        culprit_local_ranks=pl.when(pl.col("widespread")).then(empty_i).otherwise("culprit_local_ranks"),
    )
    # Teardown lines (exit codes, SIGTERMs, step cancels) say the job died, never why; failure
    # markers (a traceback header, an error-level line) that no rule explains, likewise.
    markers = active.group_by(KEY).agg(marker_only=(pl.col("symptom") == "failure_marker").all())
    verdict = verdict.join(markers, on=KEY, how="left").with_columns(
        marker_only=pl.col("marker_only").fill_null(False) & (pl.col("role") == "teardown").fill_null(False))
    teardown_only = pl.col("role") == "teardown"
    verdict = verdict.with_columns(
        outcome=pl.when(teardown_only).then(None).otherwise(pl.col("outcome")),
        ambiguous=pl.col("ambiguous") & ~teardown_only.fill_null(False),
    )
    # The scheduler's COMPLETED is the last word on whether the job failed: whatever the lines
    # say, they were not fatal. They stay as evidence, but nobody is blamed.
    completed = pl.col("state") == "COMPLETED"
    verdict = verdict.with_columns(survived=completed & pl.col("outcome").is_not_null())
    empty_s = pl.lit([], pl.List(pl.String))
    verdict = verdict.with_columns(
        outcome=pl.when(completed).then(None).otherwise(pl.col("outcome")),
        role=pl.when(completed).then(None).otherwise(pl.col("role")),
        ambiguous=pl.col("ambiguous") & ~completed,
        inference=pl.when(completed).then(None).otherwise(pl.col("inference")),
        culprit_nodes=pl.when(completed).then(empty_s).otherwise(pl.col("culprit_nodes")),
        culprit_ranks=pl.when(completed).then(empty_i).otherwise(pl.col("culprit_ranks")),
        culprit_gpus=pl.when(completed).then(empty_i).otherwise(pl.col("culprit_gpus")),
        culprit_gpu_pci=pl.when(completed).then(empty_s).otherwise(pl.col("culprit_gpu_pci")),
        culprit_local_ranks=pl.when(completed).then(empty_i).otherwise(pl.col("culprit_local_ranks")),
    )
    verdict = verdict.join(lost_telemetry(coverage), on=KEY, how="left").with_columns(
        lost=pl.col("lost").fill_null(pl.lit([], pl.List(pl.String))))
    read = stats.group_by(KEY).agg(lines_read=pl.col("lines").sum())
    verdict = verdict.join(read, on=KEY, how="left").with_columns(pl.col("lines_read").fill_null(0))
    # With the scheduler's state unknown, `healthy` needs the whole picture and no sign of failure:
    # no line at all (an empty file or folder, a binary) or a log that could not be read whole is
    # no evidence of health; a failure marker (traceback, error-level line) is a failure whose cause
    # no rule names. Those are `unknown`.
    no_fault = pl.col("outcome").is_null()
    unseen = pl.col("lines_read") == 0
    incomplete = pl.col("lost").list.len() > 0
    verdict = verdict.with_columns(
        unread=(pl.col("state") == "UNKNOWN") & pl.col("role").is_null() & (unseen | incomplete))
    verdict = verdict.with_columns(
        outcome=pl.when(no_fault & pl.col("role").is_null()
                        & (completed | ((pl.col("state") == "UNKNOWN") & ~pl.col("unread"))))
        .then(pl.lit("healthy"))
        .when(no_fault).then(pl.lit("unknown")).otherwise(pl.col("outcome")),
        domain=pl.when(no_fault).then(pl.lit("unknown")).otherwise(pl.col("domain")),
    )
    return verdict.with_columns(confidence=_confidence(), confidence_reason=_confidence_reason())


def _confidence() -> pl.Expr:
    strong_root = (pl.col("role") == "root") & (pl.col("p") >= 70)
    level = (pl.when(pl.col("ambiguous")).then(0)
             .when(pl.col("outcome").is_in(["healthy", "unknown"]) & pl.col("role").is_null())
             .then(pl.when(pl.col("state") == "COMPLETED").then(2).otherwise(0))
             .when(strong_root | ((pl.col("role") == "root") & pl.col("confirmed"))).then(2)
             .when(pl.col("role").is_in(["root", "confirmation"])).then(1)
             .when(pl.col("inference").is_in(["silent_seen", "laggard", "odd_op", "ahead"])).then(1)
             .otherwise(0))
    level = level - pl.col("peer_unresolved").cast(pl.Int32)
    # a node inferred from the job naming one host, not from the line: never enough to drain unasked
    level = level - (pl.col("node_inferred") & (pl.col("culprit_nodes").list.len() > 0)).cast(pl.Int32)
    level = level - pl.col("launcher_named").cast(pl.Int32)
    # A failed log source may hold the root cause this verdict lacks (the GPU's Xid in a syslog that
    # could not be read, behind the timeouts the applog shows). A root signature stands on its own;
    # the scheduler's COMPLETED too.
    blind = (pl.col("lost").list.len() > 0) & (pl.col("role") != "root").fill_null(True) & (pl.col("state") != "COMPLETED")
    level = level - blind.cast(pl.Int32)
    return pl.when(level >= 2).then(pl.lit("high")).when(level == 1).then(pl.lit("medium")).otherwise(pl.lit("low"))


def _confidence_reason() -> pl.Expr:
    parts = [
        pl.when(pl.col("ambiguous")).then(pl.lit("more than one cause fits the evidence")),
        pl.when(pl.col("role") == "root").then(
            pl.when(pl.col("p") >= 70).then(pl.lit("a specific root-cause signature"))
            .otherwise(pl.lit("a generic root-cause signature"))),
        pl.when(pl.col("confirmed")).then(pl.lit("corroborated by a confirming signal")),
        pl.when(pl.col("role") == "confirmation").then(pl.lit("only a corroborating signal, no direct root evidence")),
        pl.when(pl.col("role") == "cascade").then(pl.lit("only victim-side (cascade) evidence")),
        pl.when((pl.col("role") == "teardown") & ~pl.col("marker_only")).then(pl.lit("only teardown noise")),
        pl.when(pl.col("inference") == "silent_seen").then(pl.lit("culprit inferred: the only rank not reporting the timeout")),
        pl.when(pl.col("inference") == "silent_unseen").then(
            pl.lit("the only rank not reporting printed nothing at all: hang or lost node")),
        pl.when(pl.col("inference") == "laggard").then(pl.lit("culprit inferred: lowest last completed (or, all alike, last enqueued) collective")),
        pl.when(pl.col("inference") == "odd_op").then(
            pl.lit("culprit inferred: the only rank in another collective at the same SeqNum (desync)")),
        pl.when(pl.col("inference") == "ahead").then(
            pl.lit("culprit inferred: the only rank past the collective the others wait in, in another one (desync)")),
        pl.when(pl.col("peer_unresolved")).then(pl.lit("implicated peer could not be mapped to a node")),
        pl.when(pl.col("node_inferred") & (pl.col("culprit_nodes").list.len() > 0))
        .then(pl.lit("culprit node inferred: the only host the logs name")),
        pl.when(pl.col("launcher_named")).then(pl.lit("culprit rank (or local rank) from the launcher's report of the first process to fail")),
        pl.when(pl.col("launcher_ranked")).then(pl.lit("the GPU from the line, its rank from the launcher's report of the first process to fail")),
        pl.when(pl.col("rank_homed") & (pl.col("culprit_nodes").list.len() > 0))
        .then(pl.lit("culprit node: where the named rank's own lines were printed")),
        pl.when(pl.col("widespread")).then(pl.lit("most nodes or ranks report it: the cause is not in one place")),
        pl.when(pl.col("unread") & (pl.col("lines_read") == 0))
        .then(pl.lit("no readable log line: nothing to judge the job by")),
        pl.when(pl.col("unread") & (pl.col("lines_read") > 0))
        .then(pl.lit("part of the logs could not be read, and what was read names no cause")),
        pl.when(pl.col("role").is_null() & (pl.col("state") == "UNKNOWN") & ~pl.col("unread"))
        .then(pl.lit("no scheduler state and no failure signature in the logs")),
        pl.when(pl.col("role").is_null() & (pl.col("state") == "COMPLETED")).then(
            pl.when(pl.col("survived")).then(pl.lit("the job completed: the failure-like lines it printed were not fatal"))
            .otherwise(pl.lit("the job completed"))),
        pl.when(pl.col("role").is_null() & ~pl.col("state").is_in(["UNKNOWN", "COMPLETED"]))
        .then(pl.lit("the job failed but no rule names a cause")),
        pl.when((pl.col("role") == "teardown") & pl.col("outcome").is_in(["unknown"]) & ~pl.col("marker_only"))
        .then(pl.lit("the job was torn down; no line says why")),
        pl.when((pl.col("role") == "teardown") & pl.col("marker_only"))
        .then(pl.lit("failure markers (a traceback, error-level lines) but no rule names the cause")),
        pl.when(pl.col("lost").list.len() > 0).then(pl.lit("telemetry missing: ") + pl.col("lost").list.join("; ")),
    ]
    return pl.concat_list(parts).list.drop_nulls().list.join("; ")
