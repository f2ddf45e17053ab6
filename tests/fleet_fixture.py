"""A tiny cluster written the way the simulator and real systems write it: sacct text and
Loki query_range responses. Small enough to read, real enough to go through every layer."""

import json
from datetime import datetime, timezone
from pathlib import Path

from faultline.fleet.config import write_config

DAY = "2026-11-20"
SACCT = """JobID|JobName|User|Partition|State|ExitCode|Submit|Start|End|NNodes|NodeList|AllocTRES
1001|pretrain|ana|gpu|FAILED|1:0|2026-11-20T08:00:00|2026-11-20T08:01:00|2026-11-20T10:13:00|2|gpu[001-002]|cpu=128,gres/gpu=16,node=2
1002|finetune|bo|gpu|COMPLETED|0:0|2026-11-20T08:00:00|2026-11-20T08:02:00|2026-11-20T09:00:00|1|gpu003|cpu=64,gres/gpu=8,node=1
1003|eval|cy|gpu|TIMEOUT|0:0|2026-11-20T07:00:00|2026-11-20T07:01:00|2026-11-20T11:01:00|1|gpu004|cpu=64,gres/gpu=8,node=1
1004|sweep|dee|debug|FAILED|1:0|2026-11-20T11:00:00|2026-11-20T11:01:00|2026-11-20T11:20:00|1|gpu005|cpu=64,gres/gpu=8,node=1
"""


def _ns(hms: str) -> str:
    t = datetime.fromisoformat(f"{DAY}T{hms}+00:00")
    return str(int(t.timestamp() * 1e9))


def _stream(job, node, source, values):
    return {"stream": {"cluster": "alpha", "job_id": job, "attempt": "0", "node": node, "source": source},
            "values": [[_ns(t), line] for t, line in values]}


def streams() -> list[dict]:
    wd = lambda r, t: (t, f"[rank{r}]:[E1120 {t}.408271257 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught "  # noqa: E731
                       "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                       "Timeout(ms)=600000) ran for 600060 milliseconds before timing out.")
    return [
        _stream("1001", "gpu001", "syslog", [
            ("10:02:00", "Nov 20 10:02:00 gpu001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, "
                         "GPU has fallen off the bus.")]),
        _stream("1001", "gpu001", "applog", [("08:01:30", "[rank0]: step 10 loss 2.2")]),
        _stream("1001", "gpu002", "applog", [("08:01:30", "[rank1]: step 10 loss 2.2"), wd(1, "10:12:08")]),
        _stream("1003", "gpu004", "applog", [
            ("11:01:00", "slurmstepd: error: *** JOB 1003 ON gpu004 CANCELLED AT 2026-11-20T11:01:00 DUE TO TIME LIMIT ***")]),
        _stream("1004", "gpu005", "applog", [
            ("11:19:59", "[rank0]: ModuleNotFoundError: No module named 'flash_attn'")]),
    ]


def write_sim(root: Path) -> Path:
    (root / "alpha" / "sacct").mkdir(parents=True)
    (root / "alpha" / "loki").mkdir(parents=True)
    (root / "alpha" / "sacct" / f"{DAY}.txt").write_text(SACCT)
    resp = {"status": "success", "data": {"resultType": "streams", "result": streams()}}
    (root / "alpha" / "loki" / f"{DAY}.jsonl").write_text(json.dumps(resp) + "\n")
    return root


def make_fleet(tmp: Path) -> Path:
    sim = write_sim(tmp / "sim")
    data = tmp / "data"
    write_config(data, [{"name": "alpha", "scheduler": {"kind": "sacct_files", "path": str(sim)},
                         "logs": {"kind": "loki_files", "path": str(sim)}}])
    return data


START = datetime(2026, 11, 20, 0, 0, tzinfo=timezone.utc)
END = datetime(2026, 11, 21, 0, 0, tzinfo=timezone.utc)
