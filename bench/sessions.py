"""Sessions benchmark: N concurrent recovery-system clients against a real `faultline serve`.

Each client creates a session for a 4-node job, sends three observation batches (scheduler state,
the victims' logs, the culprit's syslog: ~`--lines` lines in all), attributes (fast pass) and
attributes again with final=true. Reports sessions/s and p50/p99 of the attribute latency.

    python bench/sessions.py --concurrency 64 --sessions 256
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from faultline.client import FaultlineClient, LogLines  # noqa: E402

XID = ("Nov 20 10:02:00 {node} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, "
       "GPU has fallen off the bus.")


def watchdog(rank: int) -> str:
    return (f"[rank{rank}]:[E1120 10:12:0{rank % 10}.408271257 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=600000) ran for 600060 milliseconds before timing out.")


def one_session(url: str, i: int, lines: int) -> tuple[float, float]:
    nodes = [f"gpu{i:04d}{x}" for x in "abcd"]
    chatter = [f"[rank{r}]: step {s} loss {2.5 - s / 1000:.3f}" for s in range(lines // 8) for r in range(8)]
    with FaultlineClient(url, timeout=600, retries=10) as fl:
        s = fl.create_session(f"job-{i}", cluster="bench", nodes=nodes)
        fl.observe(s.session_id, "sched", scheduler={"state": "FAILED", "exit_code": 1})
        fl.observe(s.session_id, "victims", logs=[LogLines(f"{nodes[1]}/train.log", chatter + [watchdog(r) for r in range(8, 16)])])
        t0 = time.perf_counter()
        fl.attribute(s.session_id)
        t1 = time.perf_counter()
        fl.observe(s.session_id, "syslog", logs=[LogLines(f"{nodes[0]}/syslog", [XID.format(node=nodes[0])])])
        t2 = time.perf_counter()
        a = fl.attribute(s.session_id, final=True)
        t3 = time.perf_counter()
        assert a.diagnosis.culprit_nodes == [nodes[0]], a.diagnosis
        return t1 - t0, t3 - t2


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--sessions", type=int, default=256)
    ap.add_argument("--lines", type=int, default=400, help="log lines per session (chatter + signals)")
    ap.add_argument("--workers-max", type=int, default=2)
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="faultline-bench-sessions-") as tmp, socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
        sk.close()
        cmd = [sys.executable, "-m", "faultline", "serve", "--port", str(port), "--workers-max", str(args.workers_max),
               "--queue-timeout", "600", "--sessions-db", f"{tmp}/sessions.duckdb", "--max-sessions", "100000",
               "--drains-per-cluster-hour", "1000000"]
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            while True:
                try:
                    if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            one_session(url, -1, args.lines)  # warm-up
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as ex:
                lat = list(ex.map(lambda i: one_session(url, i, args.lines), range(args.sessions)))
            wall = time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait(30)
    every = sorted(x for pair in lat for x in pair)
    q = statistics.quantiles(every, n=100)
    res = {"concurrency": args.concurrency, "sessions": args.sessions, "lines_per_session": args.lines,
           "workers_max": args.workers_max, "wall_s": round(wall, 2), "sessions_per_s": round(args.sessions / wall, 2),
           "attributions": len(every), "attribute_p50_s": round(q[49], 3), "attribute_p99_s": round(q[98], 3),
           "cpus": os.cpu_count()}
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
