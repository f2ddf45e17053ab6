"""Orchestration and writers: the fleet, day by day, in the layout of docs/fleet.md."""

from __future__ import annotations

import json
import time
from datetime import date, datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl
import yaml

from faultline.simulate.faults import BY_NAME, FAULTS
from faultline.simulate.fleet import GPU_BUS, GPUS_PER_NODE, IB_DEVS, Cluster, build_clusters, hostlist
from faultline.simulate.jobs import NODE_LOST, JobTable, SimConfig, build_jobs
from faultline.simulate import metrics_only
from faultline.simulate.lines import SOURCES, Rows, render
from faultline.simulate.stories import Story

NS = 1_000_000_000
MAX_STREAMS = 8  # streams per Loki response
NODE_STATE = {"CANCELLED": "CANCELLED"}
SACCT_HEADER = "JobID|JobName|User|Partition|State|ExitCode|Submit|Start|End|NNodes|NodeList|AllocTRES"
XID_OF = {"xid79": 79, "xid48": 48, "xid94": 94, "xid95": 95, "ecc_app": 48, "xid64": 64, "xid48_sram": 48,
          "xid95_sram": 95, "xid119": 119, "xid120": 120}
ECC_FAULTS = {"gpu_hbm", "gpu_sram"}


def _day(ns: np.ndarray) -> np.ndarray:
    return (ns // (86400 * NS)).astype(np.int64)


def _skew(seed: int, cl: Cluster, day: int) -> np.ndarray:
    """Per-node clock offset for one day: a few hundred ms to ~2 s either way."""
    r = np.random.default_rng([seed, 4, cl.index, day])
    return (r.choice([-1, 1], cl.size) * r.uniform(0.1, 2.0, cl.size) * NS).astype(np.int64)


class Fleet:
    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        rng = np.random.default_rng([cfg.seed, 0])
        from faultline.simulate.faults import LEMON_FAULTS

        self.clusters = build_clusters(cfg.clusters, cfg.nodes_per_cluster, rng, LEMON_FAULTS, cfg.lemon_share)
        self.jt: JobTable = build_jobs(cfg, self.clusters)
        metrics_only.mark(self.jt, cfg.metrics_only_per_cluster, cfg.seed)
        self.hosts = [pl.Series(cl.nodes, dtype=pl.String) for cl in self.clusters]
        self.ips = [pl.Series(cl.ips, dtype=pl.String) for cl in self.clusters]
        self.details: dict[int, str] = {}
        self.extra_ranks: dict[int, list[int]] = {}

    # -------------------------------------------------------------- logs of a set of jobs
    def logs(self, idx: list[int], cl: Cluster, day: int) -> pl.DataFrame:
        """Rendered lines of these job rows (all of one cluster and end day), missing sources removed."""
        c = self.jt.cols
        rows = Rows()
        for k, i in enumerate(idx):
            s = Story(rows, self.jt, i, k, cl, self.cfg.seed)
            s.run()
            self.details[i] = s.detail
            if s.oom_ranks:
                self.extra_ranks[i] = s.oom_ranks
        ia = np.array(idx, dtype=np.int64)
        jobs = pl.DataFrame({"_job_id": c["job_id"][ia].astype(str), "_style": c["style"][ia].astype(np.int64),
                             "_nranks": (c["nnodes"][ia] * GPUS_PER_NODE).astype(np.int64)})
        lines = render(rows, jobs, self.hosts[cl.index], self.ips[cl.index], _skew(self.cfg.seed, cl, day))
        # sources the collector would not find
        miss = c["missing"][ia]
        drop_sys = np.flatnonzero(miss == "syslog")
        drop_app = [(k, int(self.jt.nodes(i)[c["missing_pos"][i]])) for k, i in enumerate(idx) if c["missing"][i] == "applog"]
        if drop_sys.size:
            lines = lines.filter(~(pl.col("job").is_in(drop_sys.tolist()) & (pl.col("src") == 1)))
        if drop_app:
            bad = pl.DataFrame({"job": [a for a, _ in drop_app], "node": [b for _, b in drop_app]},
                               schema={"job": pl.Int64, "node": pl.Int64}).with_columns(_drop=pl.lit(True))
            lines = (lines.join(bad, on=["job", "node"], how="left", maintain_order="left")
                     .filter(~(pl.col("_drop").fill_null(False) & (pl.col("src") == 0))).drop("_drop"))
        return lines

    # -------------------------------------------------------------- truth
    def truth(self) -> pl.DataFrame:
        c = self.jt.cols
        n = len(self.jt)
        cul_nodes, cul_ranks, cul_gpus, rank_nodes, causes = [], [], [], [], []
        for i in range(n):
            cl = self.clusters[int(c["cidx"][i])]
            blame, cp = str(c["blame"][i]), int(c["culprit_pos"][i])
            node = cl.nodes[int(self.jt.nodes(i)[cp])] if cp >= 0 else ""
            f = str(c["fault"][i])
            if blame == "node":
                cul_nodes.append([node])
                cul_ranks.append([])
                cul_gpus.append([int(c["culprit_gpu"][i])] if f.startswith("gpu_") else [])
                rank_nodes.append([])
            elif blame == "rank":
                ranks = self.extra_ranks.get(i) or [int(c["culprit_rank"][i])]
                cul_nodes.append([])
                cul_ranks.append(ranks)
                cul_gpus.append([])
                rank_nodes.append(sorted({cl.nodes[int(self.jt.nodes(i)[r // GPUS_PER_NODE])] for r in ranks}))
            else:
                cul_nodes.append([])
                cul_ranks.append([])
                cul_gpus.append([])
                rank_nodes.append([])
            spec = BY_NAME.get(f)
            if spec is None:
                causes.append("The job completed")
            else:
                causes.append(spec.root_cause.format(node=node, gpu=int(c["culprit_gpu"][i]),
                                                     rank=int(c["culprit_rank"][i]), detail=self.details.get(i, "")))
        missing = [("" if not m else ("syslog absent for the whole job" if m == "syslog" else
                    f"applog absent for {self.clusters[int(c['cidx'][i])].nodes[int(self.jt.nodes(i)[c['missing_pos'][i]])]}"))
                   for i, m in enumerate(c["missing"])]
        ts = lambda k: pl.Series(c[k]).cast(pl.Datetime("ns")).dt.cast_time_unit("us").dt.replace_time_zone("UTC")  # noqa: E731
        df = pl.DataFrame({
            "cluster": c["cluster"].astype(str), "job_id": c["job_id"].astype(str),
            "attempt": c["attempt"].astype(np.int32),
            "state": [s.split(" ")[0] for s in c["raw_state"]], "raw_state": c["raw_state"].astype(str),
            "exit_code": c["exit_code"].astype(str), "outcome": c["outcome"].astype(str),
            "culprit_nodes": pl.Series(cul_nodes, dtype=pl.List(pl.String)),
            "culprit_ranks": pl.Series(cul_ranks, dtype=pl.List(pl.Int32)),
            "culprit_gpus": pl.Series(cul_gpus, dtype=pl.List(pl.Int32)),
            "culprit_rank_nodes": pl.Series(rank_nodes, dtype=pl.List(pl.String)),
            "blame": c["blame"].astype(str), "fault": c["fault"].astype(str), "variant": c["variant"].astype(str),
            "has_logs": c["has_logs"].astype(bool), "missing": missing, "root_cause": causes,
            "num_nodes": c["nnodes"].astype(np.int32), "queue": c["partition"].astype(str),
            "style": np.where(c["style"] == 0, "torchrun-new", "srun-old"),
            "submit_time": ts("submit"), "start_time": ts("start"), "end_time": ts("end"),
        })
        return df.with_columns(date=pl.col("end_time").dt.date()).sort(["cluster", "job_id", "attempt"])

    # -------------------------------------------------------------- sacct
    def sacct(self, idx: np.ndarray, cl: Cluster) -> str:
        c = self.jt.cols
        order = sorted(idx.tolist(), key=lambda i: (int(c["job_id"][i]), int(c["attempt"][i])))
        iso = lambda k: pl.Series([int(c[k][i]) for i in order]).cast(pl.Datetime("ns")).dt.strftime("%Y-%m-%dT%H:%M:%S")  # noqa: E731
        nn = np.array([int(c["nnodes"][i]) for i in order])
        df = pl.DataFrame({
            "JobID": [str(c["job_id"][i]) for i in order], "JobName": [str(c["name"][i]) for i in order],
            "User": [str(c["user"][i]) for i in order], "Partition": [str(c["partition"][i]) for i in order],
            "State": [("PREEMPTED" if c["attempt"][i] == 0 and c["state"][i] == "PREEMPTED" else str(c["raw_state"][i]))
                      for i in order],
            "ExitCode": [str(c["exit_code"][i]) for i in order],
            "Submit": iso("submit"), "Start": iso("start"), "End": iso("end"), "NNodes": nn.astype(str),
            "NodeList": [hostlist(f"gpu-{cl.letter}-", self.jt.runs[i]) for i in order],
            "AllocTRES": [f"billing={n * 128},cpu={n * 112},gres/gpu={n * 8},mem={n * 1800}G,node={n}" for n in nn],
        })
        body = df.select(pl.concat_str(pl.all(), separator="|"))[:, 0].to_list()
        return "\n".join([SACCT_HEADER, *body]) + "\n"

    # -------------------------------------------------------------- loki
    def loki(self, lines: pl.DataFrame, idx: list[int], cl: Cluster) -> pl.DataFrame:
        c = self.jt.cols
        ia = np.array(idx, dtype=np.int64)
        meta = pl.DataFrame({"job": np.arange(len(idx), dtype=np.int64), "job_id": c["job_id"][ia].astype(str),
                             "attempt": c["attempt"][ia].astype(str)})
        st = (lines.group_by(["job", "node", "src"], maintain_order=True)
              .agg(values=pl.concat_list([pl.col("ts").cast(pl.String), pl.col("line")]))
              .join(meta, on="job", how="left", maintain_order="left"))
        st = st.with_columns(
            resp=pl.int_range(pl.len()).over("job") // MAX_STREAMS,
            stream=pl.struct(cluster=pl.lit(cl.name), job_id="job_id", attempt="attempt",
                             node=self.hosts[cl.index].gather(st["node"]),
                             source=pl.col("src").replace_strict([0, 1], list(SOURCES), return_dtype=pl.String)),
            n=pl.col("values").list.len())
        res = st.group_by(["job", "resp"], maintain_order=True).agg(result=pl.struct("stream", "values"),
                                                                    lines=pl.col("n").sum(), streams=pl.len())
        return res.select(
            status=pl.lit("success"),
            data=pl.struct(resultType=pl.lit("streams"), result="result",
                           stats=pl.struct(summary=pl.struct(totalEntriesReturned="lines"),
                                           querier=pl.struct(store=pl.struct(totalChunksMatched="streams")))))

    # -------------------------------------------------------------- metrics and node events
    def metrics(self, idx: list[int], cl: Cluster, rng: np.random.Generator) -> pl.DataFrame | None:
        c = self.jt.cols
        parts = []
        for i in idx:
            f = str(c["fault"][i])
            spec = BY_NAME.get(f)
            if spec is None or (spec.group != "infra" and rng.random() > 0.1):
                continue
            cp = int(c["culprit_pos"][i])
            nodes = self.jt.nodes(i)
            node = int(nodes[cp if cp >= 0 else 0])
            tf, end = int(c["fail_t"][i]), int(c["end"][i])
            t0 = (tf - 600 * NS) // (60 * NS) * (60 * NS)
            ts = np.arange(t0, min(end, tf + 1200 * NS) + 1, 120 * NS, dtype=np.int64)
            if not ts.size:
                continue
            g = np.arange(GPUS_PER_NODE)
            T, G = np.meshgrid(ts, g, indexing="ij")
            T, G = T.ravel(), G.ravel()
            after = T >= tf
            bad_gpu = (G == int(c["culprit_gpu"][i])) & (cp >= 0) & (str(c["blame"][i]) == "node")
            xid = XID_OF.get(str(c["variant"][i]), 79 if f == "gpu_thermal" else 0) if f.startswith("gpu_") else 0
            temp = rng.normal(58, 6, T.size).round(0)
            if f == "gpu_thermal":
                temp = np.where(bad_gpu, np.minimum(temp + (T - t0) / (60 * NS) * 4, 103), temp)
            util = np.clip(rng.normal(96, 3, T.size), 0, 100).round(0)
            if f.startswith("gpu_") or f in NODE_LOST:
                util = np.where(after & bad_gpu, 0, util)
            names = {"DCGM_FI_DEV_XID_ERRORS": np.where(after & bad_gpu, xid, 0).astype(float),
                     "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": np.where(after & bad_gpu & ((f in ECC_FAULTS) | (xid == 48)), 1, 0)
                     .astype(float),
                     "DCGM_FI_DEV_GPU_TEMP": temp, "DCGM_FI_DEV_GPU_UTIL": util}
            for name, val in names.items():
                parts.append({"node": np.full(T.size, node), "gpu": G, "name": np.full(T.size, name), "ts": T,
                              "value": val, "job": np.full(T.size, i)})
            if f in ("network_switch_cable", "nic"):
                down = np.where(ts >= tf, int(rng.integers(1, 4)), 0).astype(float)
                parts.append({"node": np.full(ts.size, node), "gpu": np.full(ts.size, -1),
                              "name": np.full(ts.size, "node_infiniband_link_downed_total"), "ts": ts, "value": down,
                              "job": np.full(ts.size, i)})
        if not parts:
            return None
        cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        df = pl.DataFrame(cols)
        host = self.hosts[cl.index].gather(df["node"])
        uuid = pl.Series([u for uu in cl.gpu_uuids for u in uu], dtype=pl.String)
        gi = (df["node"] * GPUS_PER_NODE + df["gpu"].clip(0, None))
        df = df.with_columns(host=host, uuid=uuid.gather(gi), job_id=pl.Series(self.jt.cols["job_id"][df["job"].to_numpy()].astype(str)))
        gpu_labels = pl.concat_str([pl.lit('{"Hostname":"'), pl.col("host"), pl.lit('","UUID":"'), pl.col("uuid"),
                                    pl.lit('","device":"nvidia'), pl.col("gpu").cast(pl.String),
                                    pl.lit('","modelName":"NVIDIA H100 80GB HBM3","hpc_job":"'), pl.col("job_id"),
                                    pl.lit('"}')])
        # The simulator does not keep nodes exclusive to one job at a time, so its node-level samples carry
        # the job they were drawn for as well (real node-exporter samples carry none: every job on the node).
        ib_labels = pl.concat_str([pl.lit('{"instance":"'), pl.col("host"), pl.lit(':9100","device":"mlx5_'),
                                   pl.lit(""), pl.lit('","port":"1","hpc_job":"'), pl.col("job_id"), pl.lit('"}')])
        return df.select(
            cluster=pl.lit(cl.name), node="host",
            gpu=pl.when(pl.col("gpu") >= 0).then(pl.col("gpu")).cast(pl.Int32),
            name="name",
            ts=pl.from_epoch("ts", time_unit="ns").dt.cast_time_unit("us").dt.replace_time_zone("UTC"),
            value="value",
            labels=pl.when(pl.col("gpu") >= 0).then(gpu_labels).otherwise(ib_labels))

    def node_events(self, i: int, cl: Cluster, rng: np.random.Generator) -> list[dict]:
        c = self.jt.cols
        f = str(c["fault"][i])
        spec = BY_NAME.get(f)
        cp = int(c["culprit_pos"][i])
        if spec is None or spec.blame != "node" or cp < 0:
            return []
        node = cl.nodes[int(self.jt.nodes(i)[cp])]
        tf, end = int(c["fail_t"][i]), int(c["end"][i])
        g = int(c["culprit_gpu"][i])
        out = []
        if f in NODE_LOST:
            t = end - int(rng.uniform(1, 20) * NS)
            out.append((node, t, "node_fail", "Not responding"))
            why = {"host_maintenance": "host maintenance: unplanned BMC reset", "power_supply": "PSU failure, RMA",
                   "server_chassis": "chassis fault, RMA", "io_expansion_board": "PCIe fatal error on IO board",
                   "cpu": "MCE kernel panic", "system_memory": "DIMM UE, replace DIMM"}[f]
            out.append((node, t + int(rng.uniform(60, 600) * NS), "drain", why))
        elif rng.random() < 0.8:
            why = {"network_switch_cable": f"healthcheck: mlx5_{g} port 1 down",
                   "nic": f"healthcheck: mlx5_{g} firmware fatal", "ssd": "healthcheck: nvme0 missing"}.get(
                f, f"healthcheck: GPU {g} ({GPU_BUS[g]}:00.0) Xid {XID_OF.get(str(c['variant'][i]), 79)}")
            out.append((node, tf + int(rng.uniform(120, 900) * NS), "drain", why))
        else:
            return []
        out.append((node, out[-1][1] + int(rng.uniform(4 * 3600, 2 * 86400) * NS), "resume", "repaired"))
        return [{"cluster": cl.name, "node": n, "ts": t, "kind": k, "reason": r} for n, t, k, r in out]


def _iso_ns(ns: int) -> str:
    return datetime.fromtimestamp(ns / NS, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def simulate(out: Path, cfg: SimConfig, log=print) -> dict:
    """Write the whole fleet under `out` (docs/fleet.md "Simulator output"); returns a summary."""
    t_start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(cfg)
    jt, c = fleet.jt, fleet.jt.cols
    (out / "fleet.json").write_text(json.dumps({
        "seed": cfg.seed, "config": cfg.to_json(),
        "faults": [{"name": f.name, "group": f.group, "weight": f.weight, "outcome": f.outcome, "state": f.state,
                    "blame": f.blame} for f in FAULTS],
        "clusters": [cl.to_json() for cl in fleet.clusters]}, indent=1) + "\n")
    days = _day(c["end"])
    events: list[dict] = []
    n_lines = 0
    for cl in fleet.clusters:
        mine = np.flatnonzero(c["cidx"] == cl.index)
        for day in np.unique(days[mine]).tolist():
            idx = mine[days[mine] == day]
            dstr = str(date.fromordinal(date(1970, 1, 1).toordinal() + day))
            (out / cl.name / "sacct").mkdir(parents=True, exist_ok=True)
            (out / cl.name / "sacct" / f"{dstr}.txt").write_text(fleet.sacct(idx, cl))
            logged = sorted((int(i) for i in idx if c["has_logs"][i]),
                            key=lambda i: (int(c["job_id"][i]), int(c["attempt"][i])))
            rng = np.random.default_rng([cfg.seed, 5, cl.index, day])
            for i in logged:
                events += fleet.node_events(i, cl, rng)
            if not logged:
                continue
            lines = fleet.logs(logged, cl, day)
            n_lines += lines.height
            (out / cl.name / "loki").mkdir(parents=True, exist_ok=True)
            fleet.loki(lines, logged, cl).write_ndjson(out / cl.name / "loki" / f"{dstr}.jsonl")
            del lines
            m = fleet.metrics(logged, cl, rng)
            if m is not None:
                (out / cl.name / "metrics").mkdir(parents=True, exist_ok=True)
                m.write_parquet(out / cl.name / "metrics" / f"{dstr}.parquet", statistics=False)
        log(f"  {cl.name}: {len(mine)} jobs written")
    if events:
        ev = pl.DataFrame(events).sort(["cluster", "ts", "node", "kind"])
        ev = ev.with_columns(day=(pl.col("ts") // (86400 * NS)))
        for (cname, day), part in ev.partition_by(["cluster", "day"], as_dict=True, maintain_order=True).items():
            dstr = str(date.fromordinal(date(1970, 1, 1).toordinal() + int(day)))
            p = out / cname / "node_events"
            p.mkdir(parents=True, exist_ok=True)
            with (p / f"{dstr}.jsonl").open("w") as fh:
                for row in part.iter_rows(named=True):
                    fh.write(json.dumps({"node": row["node"], "ts": _iso_ns(row["ts"]), "kind": row["kind"],
                                         "reason": row["reason"]}) + "\n")
    truth = fleet.truth()
    truth.write_parquet(out / "truth.parquet", statistics=False)
    failed = truth.filter(pl.col("state") != "COMPLETED").height
    return {"jobs": len(jt), "failed": failed, "lines": n_lines, "node_events": len(events),
            "seconds": round(time.perf_counter() - t_start, 1)}


# ------------------------------------------------------------------ case folders for `faultline eval`
def _truth_culprit(row: dict) -> str | None:
    if row["blame"] == "node" and row["culprit_nodes"]:
        return "node " + ", ".join(row["culprit_nodes"])
    if row["blame"] == "rank" and row["culprit_ranks"]:
        ranks = ", ".join(f"rank {r}" for r in row["culprit_ranks"])
        return f"{ranks} (node {', '.join(row['culprit_rank_nodes'])})"
    return None


def export_cases(dest: Path, cfg: SimConfig, limit: int, max_nodes: int = 16, log=print) -> dict:
    """Write `limit` failed jobs (round-robin over faults) plus a few healthy ones as case folders."""
    dest = Path(dest)
    fleet = Fleet(cfg)
    c = fleet.jt.cols
    small = c["nnodes"] <= max_nodes
    by_fault: dict[str, list[int]] = {}
    for i in np.flatnonzero(small & c["has_logs"]):
        by_fault.setdefault(str(c["fault"][i]), []).append(int(i))
    failed_faults = sorted(f for f in by_fault if f != "none")
    picked: list[int] = []
    k = 0
    while len(picked) < limit and any(k < len(by_fault[f]) for f in failed_faults):
        for f in failed_faults:
            if k < len(by_fault[f]) and len(picked) < limit:
                picked.append(by_fault[f][k])
        k += 1
    picked += by_fault.get("none", [])[: max(2, limit // 10)]
    days = _day(c["end"])
    rendered = {}
    for i in picked:  # one job at a time: each case is independent of the others
        cl = fleet.clusters[int(c["cidx"][i])]
        rendered[i] = fleet.logs([i], cl, int(days[i]))
    truth = {(r["cluster"], r["job_id"], r["attempt"]): r for r in fleet.truth().iter_rows(named=True)}
    written = 0
    for i in picked:
        cl = fleet.clusters[int(c["cidx"][i])]
        lines = rendered[i]
        key = (cl.name, str(c["job_id"][i]), int(c["attempt"][i]))
        row = truth[key]
        name = f"{cl.name}-{key[1]}" + (f"-a{key[2]}" if key[2] else "")
        case = dest / name
        case.mkdir(parents=True, exist_ok=True)
        hosts = fleet.hosts[cl.index]
        for (node, src), part in lines.partition_by(["node", "src"], as_dict=True, maintain_order=True).items():
            d = case / hosts[int(node)]
            d.mkdir(exist_ok=True)
            fname = "train.log" if src == 0 else "syslog.log"
            (d / fname).write_text("\n".join(part["line"].to_list()) + "\n", encoding="utf-8")
        notes = f"fault {row['fault']}" + (f" ({row['variant']})" if row["variant"] else "")
        notes += f"; {row['num_nodes']} nodes, {row['style']} logs"
        if row["missing"]:
            notes += f"; {row['missing']}"
        doc = {"outcome_category": row["outcome"], "culprit": _truth_culprit(row), "root_cause": row["root_cause"],
               "notes": notes, "state": row["state"], "job_id": key[1], "cluster": key[0]}
        (case / "truth.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, width=200), encoding="utf-8")
        written += 1
    log(f"faultline simulate: wrote {written} case folders under {dest}")
    return {"cases": written}
