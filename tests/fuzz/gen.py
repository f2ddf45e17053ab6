"""Hostile and broken inputs for the diagnose path, made from a seed (pure: same seed, same inputs).

Hypothesis draws the seed and the shape of a batch; a batch of hundreds of jobs is then built here
with `random.Random(seed)`, so thousands of inputs cost one engine call, and any failing batch can be
re-made from its seed and cut down to the one job that fails (`shrink_jobs`).

Seeds of lines: every rule's own test lines (faultline/rules/packs/**) and, when present, lines of
the development corpus (../shared/corpus/real-logs). Mutations: absurd numbers (0, -1, 2^31-1,
2^63, 1e308, NaN), absurd or impossible dates, rank/node prefixes with absurd values, cut lines,
joined lines, `\r`, NUL, invalid bytes as replacement characters, ANSI colour, long lines, empty lines.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl

from faultline.warehouse.schema import TABLES

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "real-logs"

ABSURD_NUMBERS = ("0", "-1", "2147483647", "2147483648", "4294967295", "9223372036854775807",
                  "18446744073709551616", "100000000000000000000000000000", "1e308", "-1e308", "NaN", "inf",
                  "00000000000000000001", "99999999", "-2147483648", "1.7976931348623157e309")
ABSURD_DATES = ("9999-12-31T23:59:59-05:00", "0000-01-01T00:00:00+05:00", "0001-01-01T00:00:00+05:00",
                "2026-13-45T25:61:61", "1970-01-01T00:00:00Z", "2038-01-19T03:14:08Z", "Feb 30 25:00:00",
                "Dec 31 23:59:60", "[Thu Jan  1 00:00:00 1970]", "[99999999.999999]", "[-1.000000]",
                "2026-11-20 10:02:00.123456789123", "+275760-09-13T00:00:00Z", "2026-02-29T00:00:00")
PREFIXES = ("[rank{n}]: ", "{n}: ", "node-{n}: ", "gpu{n}: ", "[default{n}]:", "[1,{n}]<stderr>:",
            "(RayTrainWorker pid={n}, ip=10.0.{n}.1) ", "ip-10-0-0-{n}: ")
NOISE = ("\ufffd", "\x00", "\r", "\x1b[31m", "\x1b[0m", "\u202e", "\u0301", "\t", "|", "\\", "%s", "{}", "\x7f")


def seed_lines(ruleset, corpus: Path = CORPUS, per_file: int = 400) -> tuple[list[str], str]:
    """The lines mutations start from, and where they came from."""
    lines = [t.line for r in ruleset.log_rules for t in (*r.tests_match, *r.tests_no_match) if t.line]
    where = f"{len(lines)} rule test lines"
    if corpus.is_dir():
        n0 = len(lines)
        for p in sorted(corpus.rglob("*")):
            if p.is_file() and p.name != "truth.yaml" and p.suffix not in (".gz", ".bz2", ".xz"):
                text = p.read_bytes()[: 1 << 20].decode("utf-8", errors="replace").splitlines()
                step = max(1, len(text) // per_file)
                lines += [ln for ln in text[::step] if ln.strip()]
        where += f" + {len(lines) - n0} lines of {corpus}"
    return lines, where


def mutate(rng: random.Random, line: str) -> str:
    """One to three mutations of a line."""
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(12)
        if op == 0 and any(c.isdigit() for c in line):  # a number becomes absurd
            i = rng.choice([i for i, c in enumerate(line) if c.isdigit()])
            j = i
            while j < len(line) and line[j].isdigit():
                j += 1
            line = line[:i] + rng.choice(ABSURD_NUMBERS) + line[j:]
        elif op == 1:
            line = rng.choice(ABSURD_DATES) + " " + line
        elif op == 2:
            line = rng.choice(PREFIXES).format(n=rng.choice(ABSURD_NUMBERS + ("0", "3", "17"))) + line
        elif op == 3 and line:
            line = line[: rng.randrange(len(line))]
        elif op == 4:
            i = rng.randrange(len(line) + 1)
            line = line[:i] + rng.choice(NOISE) + line[i:]
        elif op == 5:
            line = line + rng.choice(NOISE) + line
        elif op == 6:
            line = "".join(chr(rng.choice((rng.randrange(32, 127), rng.randrange(0x80, 0xD7FF))))
                           for _ in range(rng.randrange(1, 80)))
        elif op == 7 and rng.random() < 0.05:
            line = line * rng.randint(50, 2000)  # long, and sometimes over the line limit
        elif op == 8:
            line = line.upper() if rng.random() < 0.5 else line.lower()
        elif op == 9:
            line = ""
        elif op == 10:
            line = line.replace(" ", rng.choice(("  ", "\t", "", "\u00a0")))
        else:
            line = line.replace("=", rng.choice(("=" + rng.choice(ABSURD_NUMBERS), "==", ": ")), 1)
    return line


def job_lines(rng: random.Random, seeds: list[str]) -> list[str]:
    n = rng.choice((0, 1, 1, 2, 3, 5, 8, 13))
    return [mutate(rng, rng.choice(seeds)) if rng.random() < 0.85 else rng.choice(seeds) for _ in range(n)]


def _absurd_time(rng: random.Random) -> datetime | None:
    return rng.choice((None, datetime(1, 1, 1, tzinfo=timezone.utc), datetime(9999, 12, 31, tzinfo=timezone.utc),
                       datetime(1970, 1, 1, tzinfo=timezone.utc), datetime(2026, 11, 20, 10, tzinfo=timezone.utc)))


def fleet_batch(seed: int, n_jobs: int, seeds: list[str]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(jobs, logs, coverage) of `n_jobs` generated jobs, in the warehouse's schemas, as collect writes them."""
    rng = random.Random(seed)
    jobs, logs, cov = [], [], []
    base = datetime(2026, 11, 20, 8, tzinfo=timezone.utc)
    for i in range(n_jobs):
        job_id = f"s{seed}-{i}"
        start = base + timedelta(minutes=rng.randrange(600)) if rng.random() < 0.8 else _absurd_time(rng)
        end = (start + timedelta(minutes=rng.randrange(1, 300)) if start and start.year < 9999 and rng.random() < 0.8
               else _absurd_time(rng))
        nodes = [f"gpu{rng.randrange(1000):03d}" for _ in range(rng.choice((0, 1, 2, 4)))]
        state = rng.choice(("FAILED", "FAILED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "CANCELLED",
                            "COMPLETED", "UNKNOWN"))
        jobs.append({"cluster": "fuzz", "job_id": job_id, "attempt": rng.choice((0, 0, 1)), "scheduler": "slurm",
                     "name": "j", "user": "u", "queue": "gpu", "state": state, "raw_state": state,
                     "exit_code": rng.choice((None, 0, 1, 137, -(2**31), 2**31 - 1)),
                     "signal": rng.choice((None, 0, 9, 6)), "submit_time": start, "start_time": start,
                     "end_time": end, "num_nodes": len(nodes), "num_gpus": rng.choice((None, 0, 8, 2**31 - 1)),
                     "nodes": nodes})
        attempt = jobs[-1]["attempt"]
        lines = job_lines(rng, seeds)
        for seq, line in enumerate(lines):
            node = rng.choice(nodes) if nodes and rng.random() < 0.7 else None
            ts = rng.choice((None, start, end, _absurd_time(rng)))
            logs.append({"cluster": "fuzz", "job_id": job_id, "attempt": attempt, "node": node, "rank": None,
                         "local_rank": None, "gpu": None, "source": rng.choice(("applog", "syslog", "applog")),
                         "file": f"{node or 'x'}/{rng.choice(('train.log', 'dmesg'))}", "seq": seq, "ts": ts,
                         "line": line})
        for source in ("applog", "syslog", "scheduler", "k8s_event"):
            status = rng.choice(("ok", "ok", "empty", "error", "not_configured"))
            cov.append({"cluster": "fuzz", "job_id": job_id, "attempt": attempt, "source": source, "status": status,
                        "rows": len(lines), "reason": "" if status == "ok" else "fuzz"})
    jobs_f = pl.DataFrame(jobs, schema=TABLES["jobs"]).unique(["cluster", "job_id", "attempt"], keep="first",
                                                                maintain_order=True)
    return jobs_f, pl.DataFrame(logs, schema=TABLES["logs"]), pl.DataFrame(cov, schema=TABLES["coverage"])


def with_identity(logs: pl.DataFrame) -> pl.DataFrame:
    """Who spoke, read from each line as collect does (`fleet.collect.parse_logs`)."""
    from faultline.logparse import identity_exprs

    ident = identity_exprs()
    return logs.with_columns(node=pl.coalesce(ident["node"], pl.col("node")), rank=ident["rank"])


# ---------------------------------------------------------------- whole files (one diagnose_files each)

def file_bytes(rng: random.Random, seeds: list[str]) -> bytes:
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 4096))
    if kind == 1:  # text with random bytes inside
        text = "\n".join(job_lines(rng, seeds)).encode("utf-8", "surrogatepass")
        i = rng.randrange(len(text) + 1)
        return text[:i] + rng.randbytes(rng.randrange(1, 64)) + text[i:]
    if kind == 2:  # CR-only and CRLF
        return rng.choice(("\r", "\r\n")).join(job_lines(rng, seeds)).encode("utf-8", "surrogatepass")
    return "\n".join(job_lines(rng, seeds)).encode("utf-8", "surrogatepass")
