"""Line rows and their rendering.

A job's log is made as rows: (job, node, source, real time, rank, local rank, pid, ints a-d, peer
node, template). Python decides *which* rows exist with numpy arrays (one call per rank set, never
per line); Polars builds the strings, one `concat_str` per template over every row of a day.
Rare one-off lines (tracebacks, kernel messages) are "raw" rows: text already formatted in Python
with only the time/host tokens left for Polars to fill.

Tokens: {P} rank prefix (`[rank3]:` from torchrun/c10d in new-style jobs, `3:` from `srun --label`
in old-style ones), {L} the srun label before NCCL lines (`3: ` or nothing), {R} rank, {LR} local
rank, {PID}, {TID}, {H} host, {IP} host address, {PH}/{PIP} the peer node's host/address, {BUS} GPU
PCI bus, {A}-{D} ints, {J} job id, {NR} world size, and the node-clock timestamps {C10}
(`321 02:07:08.408271257`), {GLOG} (`0321 02:07:08.408271`), {PY} (`2024-03-21 02:07:08,408`),
{SYS} (`Mar 21 02:07:08`), {ISO} (`2024-03-21T02:07:08`), {TRUN} (`2024-03-21_02:07:08`).
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from faultline.simulate.fleet import GPU_BUS

APPLOG, SYSLOG = 0, 1
SOURCES = ("applog", "syslog")
_TOKEN = re.compile(r"\{(P|L|R|LR|PID|TID|H|IP|PH|PIP|BUS|A|B|C|D|J|NR|C10|GLOG|PY|SYS|ISO|TRUN)\}")
_INT_COLS = ("job", "node", "src", "ts", "rank", "lr", "pid", "tid", "a", "b", "c", "d", "peer", "tpl")
_TIME_FMT = {"C10": "%-m%d %H:%M:%S%.9f", "GLOG": "%m%d %H:%M:%S%.6f", "PY": "%Y-%m-%d %H:%M:%S,%3f",
             "SYS": "%b %e %H:%M:%S", "ISO": "%Y-%m-%dT%H:%M:%S", "TRUN": "%Y-%m-%d_%H:%M:%S"}


class Rows:
    """Accumulates line rows as numpy chunks; `frame()` concatenates them once."""

    def __init__(self) -> None:
        self.templates: dict[str, int] = {}
        self.chunks: list[dict[str, np.ndarray]] = []
        self.raw_text: list[str] = []
        self.raw_chunks: list[dict[str, np.ndarray]] = []
        self.order = 0

    def _tid(self, template: str) -> int:
        t = self.templates.get(template)
        if t is None:
            t = self.templates[template] = len(self.templates)
        return t

    def add(self, template: str, job: int, node, ts, *, src: int = APPLOG, rank=-1, lr=-1, pid=0, tid=0,
            a=0, b=0, c=0, d=0, peer=-1) -> None:
        cols = {"node": node, "ts": ts, "rank": rank, "lr": lr, "pid": pid, "tid": tid, "a": a, "b": b,
                "c": c, "d": d, "peer": peer}
        n = max((np.size(v) for v in cols.values()), default=1)
        if n == 0:
            return
        out = {k: np.broadcast_to(np.asarray(v, dtype=np.int64), (n,)) for k, v in cols.items()}
        out["job"] = np.full(n, job, np.int64)
        out["src"] = np.full(n, src, np.int64)
        out["tpl"] = np.full(n, self._tid(template), np.int64)
        out["ord"] = np.arange(self.order, self.order + n, dtype=np.int64)
        self.order += n
        self.chunks.append(out)

    def block(self, templates: list[str], job: int, node, ts, step_ns: int = 1000, **kw) -> None:
        """Several lines per row set, in order, each a microsecond after the one before."""
        ts = np.asarray(ts, dtype=np.int64)
        for k, t in enumerate(templates):
            self.add(t, job, node, ts + k * step_ns, **kw)

    def raw(self, text: str, job: int, node: int, ts: int, *, src: int = APPLOG, rank: int = -1) -> None:
        self.raw_text.append(text)
        self.raw_chunks.append({"job": job, "node": node, "ts": ts, "src": src, "rank": rank, "ord": self.order})
        self.order += 1

    def raws(self, lines: list[str], job: int, node: int, ts: int, *, src: int = APPLOG, rank: int = -1,
             step_ns: int = 1000) -> None:
        for k, text in enumerate(lines):
            self.raw(text, job, node, ts + k * step_ns, src=src, rank=rank)

    def frame(self) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
        if self.chunks:
            cols = {k: np.concatenate([c[k] for c in self.chunks]) for k in (*_INT_COLS, "ord")}
        else:
            cols = {k: np.zeros(0, np.int64) for k in (*_INT_COLS, "ord")}
        tpl = pl.DataFrame(cols)
        if self.raw_chunks:
            raw = pl.DataFrame(self.raw_chunks, schema={k: pl.Int64 for k in ("job", "node", "ts", "src", "rank", "ord")})
            raw = raw.with_columns(text=pl.Series(self.raw_text, dtype=pl.String))
        else:
            raw = pl.DataFrame(schema={**{k: pl.Int64 for k in ("job", "node", "ts", "src", "rank", "ord")},
                                       "text": pl.String})
        names = [None] * len(self.templates)
        for t, i in self.templates.items():
            names[i] = t
        return tpl, raw, names


def _token_expr(tok: str) -> pl.Expr:
    s = lambda c: pl.col(c).cast(pl.String)  # noqa: E731
    if tok in _TIME_FMT:
        return pl.col("_local").dt.strftime(_TIME_FMT[tok])
    if tok == "P":
        return pl.when(pl.col("_style") == 0).then(pl.concat_str([pl.lit("[rank"), s("rank"), pl.lit("]:")])) \
            .otherwise(pl.concat_str([s("rank"), pl.lit(":")]))
    if tok == "L":
        return pl.when(pl.col("_style") == 0).then(pl.lit("")).otherwise(pl.concat_str([s("rank"), pl.lit(": ")]))
    if tok == "BUS":
        return pl.col("lr").replace_strict(list(range(8)), list(GPU_BUS), default="00", return_dtype=pl.String)
    return {"R": s("rank"), "LR": s("lr"), "PID": s("pid"), "TID": s("tid"), "A": s("a"), "B": s("b"),
            "C": s("c"), "D": s("d"), "H": pl.col("_host"), "IP": pl.col("_ip"), "PH": pl.col("_phost"),
            "PIP": pl.col("_pip"), "J": pl.col("_job_id"), "NR": s("_nranks")}[tok]


def _template_expr(template: str) -> pl.Expr:
    parts: list[pl.Expr] = []
    pos = 0
    for m in _TOKEN.finditer(template):
        if m.start() > pos:
            parts.append(pl.lit(template[pos:m.start()]))
        parts.append(_token_expr(m.group(1)))
        pos = m.end()
    if pos < len(template):
        parts.append(pl.lit(template[pos:]))
    return pl.concat_str(parts) if parts else pl.lit("")


def render(rows: Rows, jobs: pl.DataFrame, hosts: pl.Series, ips: pl.Series, skew_ns: np.ndarray) -> pl.DataFrame:
    """All rows of a batch -> (job, node, src, ts [node clock, ns], ord, line), sorted for writing.

    `jobs` is indexed by the rows' `job` and carries _job_id, _style, _nranks.
    """
    tpl, raw, names = rows.frame()
    skew = pl.Series("skew", skew_ns, dtype=pl.Int64)

    def enrich(df: pl.DataFrame) -> pl.DataFrame:
        return df.with_columns(
            _job_id=jobs["_job_id"].gather(df["job"]),
            _style=jobs["_style"].gather(df["job"]),
            _nranks=jobs["_nranks"].gather(df["job"]),
            _host=hosts.gather(df["node"]),
            _ip=ips.gather(df["node"]),
            _tsl=df["ts"] + skew.gather(df["node"]),
        ).with_columns(_local=pl.from_epoch("_tsl", time_unit="ns"))

    parts = []
    if tpl.height:
        tpl = enrich(tpl)
        peer = tpl["peer"].clip(0, None)
        tpl = tpl.with_columns(_phost=hosts.gather(peer), _pip=ips.gather(peer))
        for (tid,), part in tpl.partition_by("tpl", as_dict=True, maintain_order=True).items():
            parts.append(part.select("job", "node", "src", ts="_tsl", ord="ord", line=_template_expr(names[tid])))
    if raw.height:
        raw = enrich(raw)
        text = pl.col("text")
        for tok in ("H", "C10", "GLOG", "PY", "SYS", "ISO", "TRUN"):
            if raw["text"].str.contains("{" + tok + "}", literal=True).any():
                text = text.str.replace_all("{" + tok + "}", _token_expr(tok), literal=True)
        parts.append(raw.select("job", "node", "src", ts="_tsl", ord="ord", line=text))
    if not parts:
        return pl.DataFrame(schema={"job": pl.Int64, "node": pl.Int64, "src": pl.Int64, "ts": pl.Int64,
                                    "ord": pl.Int64, "line": pl.String})
    return pl.concat(parts).sort(["job", "node", "src", "ts", "ord"])
