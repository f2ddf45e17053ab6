"""Collector: Slurm's REST API (slurmrestd) with JWT -> jobs, allocations and node events.

`GET /slurmdb/<ver>/jobs?start_time=&end_time=` (accounting, like sacct), `GET /slurmdb/<ver>/job/<id>`,
`GET /slurm/<ver>/nodes` (state, drain/down reason, who set it and when). Requests carry
`X-SLURM-USER-NAME` and `X-SLURM-USER-TOKEN` (a JWT from `scontrol token`, read from the environment
variable the config names). slurmrestd answers an authentication or database failure with HTTP 200 and
an `errors` list: those are errors here too. The HTTP client is injected; retries (tenacity) cover
refused connections, timeouts, 429 and 5xx.

Slurm 22.05 reports `exit_code.return_code` 0 (status SUCCESS) for jobs that FAILED (sacct's text is
right): the state is trusted, and a 0 beside a failed state is recorded as unknown (null), never as 0.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from urllib.parse import urlsplit

import httpx
import polars as pl
import tenacity

from faultline.collectors.http import json_answer
from faultline.collectors.slurm import NODE_EVENTS_SCHEMA, STATE_MAP, expand_hostlists, node_event_kind
from faultline.warehouse.schema import TABLES

FAILED_WORDS = ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "CANCELLED", "PREEMPTED", "BOOT_FAIL",
                "DEADLINE")


class SlurmRestError(RuntimeError):
    """A request that failed for good; the message says why (HTTP status or slurmrestd's errors)."""


class _Retryable(SlurmRestError):
    pass


@dataclass(frozen=True)
class SlurmRestSettings:
    url: str
    token_env: str = "SLURM_JWT"
    user_name: str = "root"
    api_version: str = "v0.0.38"
    timeout_s: float = 30.0
    retries: int = 3
    backoff_s: float = 0.5

    @classmethod
    def from_config(cls, section: dict) -> "SlurmRestSettings":
        unknown = sorted(set(section) - set(cls.__dataclass_fields__) - {"kind", "node_events"})
        if unknown:
            hint = "; the JWT goes in an environment variable named by token_env" if any(
                k in ("token", "jwt", "password") for k in unknown) else ""
            raise ValueError(f"unknown key(s) {unknown}{hint}")
        url = section.get("url")
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"url must be an http:// or https:// address of slurmrestd, got {url!r}")
        values: dict = {"url": url.rstrip("/")}
        for key in ("token_env", "user_name", "api_version"):
            v = section.get(key, cls.__dataclass_fields__[key].default)
            if not isinstance(v, str) or not v:
                raise ValueError(f"{key} must be a non-empty string")
            values[key] = v
        if not values["api_version"].startswith("v0.0."):
            raise ValueError(f"api_version must look like v0.0.38, got {values['api_version']!r}")
        for key, kind, low in (("timeout_s", float, 0), ("retries", int, 0), ("backoff_s", float, 0)):
            v = section.get(key, cls.__dataclass_fields__[key].default)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < low \
                    or (key == "timeout_s" and v == 0) or (kind is int and not float(v).is_integer()):
                raise ValueError(f"{key} must be a number >= {low}, got {v!r}")
            values[key] = kind(v)
        return cls(**values)


class SlurmRestClient:
    def __init__(self, settings: SlurmRestSettings, http: httpx.Client | None = None, env: dict | None = None,
                 sleep=None):
        self.s = settings
        env = os.environ if env is None else env
        token = env.get(settings.token_env)
        if not token:
            raise SlurmRestError(f"environment variable {settings.token_env} is not set (the JWT for slurmrestd, "
                                 f"e.g. from `scontrol token username={settings.user_name}`)")
        token = token.removeprefix("SLURM_JWT=")
        headers = {"X-SLURM-USER-NAME": settings.user_name, "X-SLURM-USER-TOKEN": token, "Accept": "application/json"}
        self._own = http is None
        self.http = http or httpx.Client(base_url=settings.url, timeout=settings.timeout_s)
        self._headers = headers
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Retryable), stop=tenacity.stop_after_attempt(settings.retries + 1),
            wait=tenacity.wait_random_exponential(multiplier=settings.backoff_s, max=30),
            sleep=sleep or tenacity.nap.sleep, reraise=True)

    def close(self) -> None:
        if self._own:
            self.http.close()

    @staticmethod
    def _reason(r: httpx.Response) -> str:
        """slurmrestd's own errors list when the body has one, else the text."""
        try:
            doc = r.json()
            errs = [e for e in doc.get("errors") or [] if isinstance(e, dict)] if isinstance(doc, dict) else []
            if errs:
                e = errs[0]
                return (f"slurmrestd error {e.get('error_number', e.get('error_code', '?'))}: "
                        f"{e.get('error') or e.get('description') or ''} ({e.get('source', '')})")[:300]
        except ValueError:
            pass
        return " ".join(r.text.split())[:200] or r.reason_phrase

    def _once(self, path: str, params: dict | None) -> dict:
        doc = json_answer(lambda: self.http.get(path, params=params, headers=self._headers), self.s.url,
                          self.s.timeout_s, SlurmRestError, _Retryable, self._reason)
        if not isinstance(doc, dict):
            raise SlurmRestError("response is not a JSON object")
        errors = [e for e in doc.get("errors") or [] if isinstance(e, dict) and (e.get("error") or e.get("description"))]
        if errors:
            e = errors[0]
            raise SlurmRestError(f"slurmrestd error {e.get('error_number', e.get('error_code', '?'))}: "
                                 f"{e.get('error') or e.get('description')} ({e.get('source', path)})")
        return doc

    def get(self, path: str, params: dict | None = None) -> dict:
        attempts = self.s.retries + 1
        try:
            return self._retrying(self._once, path, params)
        except _Retryable as exc:
            raise SlurmRestError(f"{exc} (gave up after {attempts} attempt{'s' if attempts > 1 else ''})") from None

    def jobs(self, start: datetime, end: datetime) -> dict:
        """Jobs around [start, end). 22.05 reads start_time/end_time as sacct does (not epoch: "Unable to parse
        time format"), in slurmrestd's own time zone, which the caller cannot know: the range is asked a day
        wider on each side, and the caller keeps the jobs whose end (epoch in the answer) falls inside."""
        fmt = "%Y-%m-%dT%H:%M:%S"
        return self.get(f"/slurmdb/{self.s.api_version}/jobs",
                        {"start_time": (start.astimezone(timezone.utc) - timedelta(days=1)).strftime(fmt),
                         "end_time": (end.astimezone(timezone.utc) + timedelta(days=1)).strftime(fmt)})

    def job(self, job_id: str) -> dict:
        return self.get(f"/slurmdb/{self.s.api_version}/job/{job_id}")

    def nodes(self) -> dict:
        return self.get(f"/slurm/{self.s.api_version}/nodes")


def _epoch(v) -> datetime | None:
    if isinstance(v, dict):  # later versions: {"set": true, "number": N}
        v = v.get("number") if v.get("set", True) else None
    return datetime.fromtimestamp(v, timezone.utc) if isinstance(v, (int, float)) and v > 0 else None


def _state(job: dict) -> str:
    st = job.get("state")
    st = st.get("current") if isinstance(st, dict) else st
    if isinstance(st, list):  # later versions: a list of flags
        st = st[0] if st else ""
    return str(st or "")


def parse_jobs(doc: dict, cluster: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """slurmdb `jobs` JSON -> (jobs, allocations) per the warehouse schema; the same columns sacct gives."""
    rows = []
    for j in doc.get("jobs") or []:
        if not isinstance(j, dict) or j.get("job_id") is None:
            raise SlurmRestError("malformed job record (no job_id)")
        raw_state = _state(j)
        word = raw_state.split()[0] if raw_state else ""
        ec = j.get("exit_code") if isinstance(j.get("exit_code"), dict) else {}
        code = ec.get("return_code")
        code = code.get("number") if isinstance(code, dict) else code
        sig = ec.get("signal") or {}
        sig = sig.get("signal_id") if isinstance(sig, dict) else None
        sig = sig.get("number") if isinstance(sig, dict) else sig
        if word in FAILED_WORDS and word != "CANCELLED" and code == 0 and not sig:
            code = None  # 22.05 reports 0 for failed jobs: unknown, not success
        t = j.get("time") or {}
        gpus = sum(int(x.get("count") or 0) for x in (j.get("tres") or {}).get("allocated") or []
                   if x.get("type") == "gres" and str(x.get("name", "")).split(":")[0] == "gpu") or None
        n_nodes = next((int(x.get("count") or 0) for x in (j.get("tres") or {}).get("allocated") or []
                        if x.get("type") == "node"), None)
        array = j.get("array") or {}
        task = array.get("task_id")
        task = task.get("number") if isinstance(task, dict) else task
        job_id = f"{array['job_id']}_{task}" if array.get("job_id") and task is not None else str(j["job_id"])
        rows.append({"cluster": cluster, "job_id": job_id, "scheduler": "slurm", "name": j.get("name"),
                     "user": j.get("user"), "queue": j.get("partition"),
                     "state": STATE_MAP.get(word, "UNKNOWN"), "raw_state": raw_state,
                     "exit_code": code, "signal": sig if sig else (0 if code is not None else None),
                     "submit_time": _epoch(t.get("submission")), "start_time": _epoch(t.get("start")),
                     "end_time": _epoch(t.get("end")), "num_nodes": n_nodes, "num_gpus": gpus,
                     "nodelist": j.get("nodes") or ""})
    schema = {**{k: v for k, v in TABLES["jobs"].items() if k not in ("attempt", "nodes")}, "nodelist": pl.String}
    raw = pl.DataFrame(rows, schema=schema)
    jobs = raw.with_columns(attempt=pl.int_range(pl.len()).over("job_id").cast(pl.Int32),
                            nodes=expand_hostlists(raw["nodelist"])).select(list(TABLES["jobs"]))
    jobs = jobs.with_columns(num_nodes=pl.coalesce(pl.col("num_nodes").replace(0, None),
                                                   pl.col("nodes").list.len().cast(pl.Int32)))
    allocations = (jobs.select("cluster", "job_id", "attempt", "nodes", "num_gpus", "num_nodes")
                   .explode("nodes").drop_nulls("nodes")
                   .select("cluster", "job_id", "attempt", node=pl.col("nodes"), ranks=pl.lit(None, pl.List(pl.Int32)),
                           gpus=(pl.col("num_gpus") // pl.col("num_nodes").clip(1)).cast(pl.Int32)))
    return jobs.cast(TABLES["jobs"]), allocations.cast(TABLES["allocations"])


def parse_nodes(doc: dict, cluster: str) -> pl.DataFrame:
    """`nodes` JSON -> node_events: every node with a drain/down/fail state or a standing reason."""
    rows = []
    for n in doc.get("nodes") or []:
        state = n.get("state")
        words = [str(w) for w in (state if isinstance(state, list) else [state]) if w] + \
            [str(w) for w in n.get("state_flags") or []]
        flags = [w.upper() for w in words]
        kind = ("drain" if any(w.startswith("DRAIN") for w in flags)
                else "node_fail" if any(w.startswith(("DOWN", "FAIL", "NOT_RESPONDING")) for w in flags)
                else None)
        reason = n.get("reason") or ""
        if kind is None and not reason:
            continue
        user = n.get("reason_set_by_user") or ""
        rows.append({"cluster": cluster, "node": n.get("name"), "ts": _epoch(n.get("reason_changed_at")),
                     "kind": kind or node_event_kind(flags[0] if flags else "unknown"),
                     "reason": f"{reason} [{user}]" if user else reason})
    return pl.DataFrame(rows, schema=NODE_EVENTS_SCHEMA)


def fetch_jobs(config: dict, cluster: str, start: datetime, end: datetime, http: httpx.Client | None = None,
               env: dict | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    client = SlurmRestClient(SlurmRestSettings.from_config(config), http=http, env=env)
    try:
        return parse_jobs(client.jobs(start, end), cluster)
    finally:
        client.close()


def fetch_job(config: dict, cluster: str, job_id: str, http: httpx.Client | None = None,
              env: dict | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    client = SlurmRestClient(SlurmRestSettings.from_config(config), http=http, env=env)
    try:
        try:
            doc = client.job(job_id)
        except SlurmRestError as exc:
            if "error 9003" not in str(exc):  # "Nothing found with query": no such job, not a failure
                raise
            doc = {"jobs": []}
        return parse_jobs(doc, cluster)
    finally:
        client.close()


def fetch_node_events(config: dict, cluster: str, http: httpx.Client | None = None,
                      env: dict | None = None) -> pl.DataFrame:
    client = SlurmRestClient(SlurmRestSettings.from_config(config), http=http, env=env)
    try:
        return parse_nodes(client.nodes(), cluster)
    finally:
        client.close()
