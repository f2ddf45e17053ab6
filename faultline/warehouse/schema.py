"""Warehouse tables of DESIGN.md: names, grains, Polars schemas, keys and partitioning.

Every table is partitioned by `cluster` and `date` (UTC day) as Hive-style folders,
one Parquet file per (partition, batch). Rows also carry `_batch` (the deterministic id of
the write that produced them) and `_written_at`; readers keep, per key, the row of the
newest write, so re-running a window replaces instead of duplicating.
"""

from __future__ import annotations

import polars as pl

SCHEMA_VERSION = 2  # 2: commit log (`commits`), batches of TX_TABLES visible once committed; diagnoses.inputs

TS = pl.Datetime("us", "UTC")
JOB_KEY = ["cluster", "job_id", "attempt"]

TABLES: dict[str, dict[str, pl.DataType]] = {
    # one row per job attempt
    "jobs": {
        "cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "scheduler": pl.String,
        "name": pl.String, "user": pl.String, "queue": pl.String, "state": pl.String, "raw_state": pl.String,
        "exit_code": pl.Int32, "signal": pl.Int32, "submit_time": TS, "start_time": TS, "end_time": TS,
        "num_nodes": pl.Int32, "num_gpus": pl.Int32, "nodes": pl.List(pl.String),
    },
    # job attempt x node
    "allocations": {
        "cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "node": pl.String,
        "ranks": pl.List(pl.Int32), "gpus": pl.Int32,
    },
    # one log line
    "logs": {
        "cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "node": pl.String, "rank": pl.Int32,
        "local_rank": pl.Int32, "gpu": pl.Int32, "source": pl.String, "file": pl.String, "seq": pl.Int64,
        "ts": TS, "line": pl.String,
    },
    # one metric sample
    "metrics": {
        "cluster": pl.String, "node": pl.String, "gpu": pl.Int32, "name": pl.String, "ts": TS,
        "value": pl.Float64, "labels": pl.String,
    },
    # one node event (drain, node_fail, not_ready, ...)
    "node_events": {
        "cluster": pl.String, "node": pl.String, "ts": TS, "kind": pl.String, "reason": pl.String,
    },
    # pod -> node of a Kubernetes job, recorded while the pod exists (the placement recorder, collect)
    "placements": {
        "cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "namespace": pl.String, "pod": pl.String,
        "uid": pl.String, "node": pl.String, "gpus": pl.Int32, "seen_at": TS,
    },
    # job x source: was the telemetry there?
    "coverage": {
        "cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "source": pl.String,
        "status": pl.String, "rows": pl.Int64, "reason": pl.String,
    },
    # one rule hit that survived the filter phase
    "symptoms": {
        "cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "ruleset": pl.String,
        "rule_id": pl.String, "symptom": pl.String, "role": pl.String, "domain": pl.String,
        "outcome": pl.String, "node": pl.String, "rank": pl.Int32, "gpu": pl.Int32, "ts": TS,
        "implicates": pl.String, "peer": pl.String, "peer_node": pl.String, "superseded_by": pl.String,
        "source": pl.String, "file": pl.String, "seq": pl.Int64, "line": pl.String, "captures": pl.String,
    },
    # job attempt x ruleset: the verdict (nested parts as JSON text, queryable with DuckDB's json functions)
    "diagnoses": {
        "cluster": pl.String, "job_id": pl.String, "attempt": pl.Int32, "ruleset": pl.String,
        "outcome": pl.String, "domain": pl.String, "root_cause": pl.String,
        "culprit_nodes": pl.List(pl.String), "culprit_ranks": pl.List(pl.Int32), "culprit_gpus": pl.List(pl.Int32),
        "affected_nodes": pl.List(pl.String), "ambiguous": pl.Boolean, "confidence": pl.String,
        "confidence_reason": pl.String, "action": pl.String, "action_targets": pl.List(pl.String),
        "candidates": pl.String, "evidence": pl.String, "coverage": pl.String,
        "queue": pl.String, "end_time": TS, "num_nodes": pl.Int32, "num_gpus": pl.Int32, "gpu_hours": pl.Float64,
        "diagnosed_at": TS, "diagnosis": pl.String, "inputs": pl.String,
    },
    # the commit log: one row per committed batch and cluster (the manifest, written last: rows of a batch
    # of TX_TABLES are visible only once it is here); collect's rows carry the scheduler cursor
    "commits": {
        "cluster": pl.String, "batch": pl.String, "kind": pl.String, "source": pl.String, "ruleset": pl.String,
        "read_from": TS, "read_to": TS, "cursor": TS, "jobs": pl.Int64, "failed": pl.Int64, "rows": pl.Int64,
        "covers": pl.List(pl.String), "dates": pl.List(pl.Date), "committed_at": TS,
    },
    # per node and day
    "trends_node_day": {
        "cluster": pl.String, "date": pl.Date, "node": pl.String, "times_culprit": pl.Int64,
        "times_affected": pl.Int64, "symptoms": pl.Int64, "outcomes": pl.List(pl.String),
    },
    # per outcome, day, cluster and queue
    "trends_outcome_day": {
        "cluster": pl.String, "date": pl.Date, "queue": pl.String, "outcome": pl.String, "jobs": pl.Int64,
        "gpu_hours_lost": pl.Float64, "ambiguous": pl.Int64,
    },
}

# The key that identifies a row across re-runs (newest write wins); None: rows are unique per batch.
KEYS: dict[str, list[str] | None] = {
    "jobs": JOB_KEY,
    "allocations": [*JOB_KEY, "node"],
    "logs": [*JOB_KEY, "file", "seq"],
    "metrics": ["cluster", "node", "gpu", "name", "labels", "ts"],  # labels: an IB port, an exporter job
    "node_events": ["cluster", "node", "ts", "kind"],
    "placements": ["cluster", "uid"],  # a pod (uid) is bound to one node for its whole life
    "coverage": [*JOB_KEY, "source"],
    "symptoms": [*JOB_KEY, "ruleset", "file", "seq", "rule_id"],
    "diagnoses": [*JOB_KEY, "ruleset"],
    "commits": ["cluster", "batch"],
    "trends_node_day": ["cluster", "date", "node"],
    "trends_outcome_day": ["cluster", "date", "queue", "outcome"],
}

# Writers give every frame a `date` (pl.Date) column: the UTC day of the job's end for job-keyed
# tables, of the sample/event for metrics and node events, of the first sighting for placements. It and `cluster` choose the partition.
PARTITION_BY = ("cluster", "date")

# Tables written in transactions: a batch's rows become visible to readers only once the batch is in
# `commits` (jobs, logs and coverage of one collect together; diagnoses with their symptoms).
TX_TABLES = ("jobs", "allocations", "logs", "coverage", "symptoms", "diagnoses")

# Columns added after a table's first release: a frame without them is written with nulls.
OPTIONAL: dict[str, tuple[str, ...]] = {"diagnoses": ("inputs",)}
