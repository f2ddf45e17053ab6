"""Property tests of the diagnose path over generated hostile input (issue 10). See tests/fuzz/README.md.

Profiles (FAULTLINE_FUZZ_PROFILE): `ci` (default, derandomized: the same inputs every run) tries
>= 20,000 generated jobs through the fleet engine in batches plus a few dozen whole folders through
`diagnose_files`; `long` (by hand) tries >= 100,000, with fresh seeds each run.

Properties, for every batch or folder:
- no exception escapes;
- every failed job gets exactly one diagnosis, with a taxonomy outcome and confidence;
- deterministic: the same input twice (the batch's jobs in reverse order the second time) gives the
  same JSON for every job (`diagnosed_at` fixed);
- memory: the peak RSS growth of one call is at most MEM_BASE + MEM_PER_BYTE x the input's text bytes;
- coverage names every input file that was not read whole (skipped, unreadable, cut, binary, empty).
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import random
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from faultline.fleet.diagnose import diagnose_tables
from faultline.limits import ReadLimits
from faultline.pipeline import collect_files, run_phases
from faultline.taxonomy import FAILED_STATES, OUTCOMES

from . import gen

PROFILE = os.environ.get("FAULTLINE_FUZZ_PROFILE", "ci")
LONG = PROFILE == "long"
JOBS_PER_BATCH = 2200  # one engine call costs ~1.2 s of CPU per 1000 jobs at this size, 2.5 s at 550
BATCHES = 50 if LONG else 10  # x 2200 jobs: 110,000 / 22,000 generated jobs
FOLDERS = 300 if LONG else 30
AT = "2026-11-21T00:00:00Z"
MIB = 1 << 20
# Stated memory bound of one diagnose call: a fixed allowance for the engine's frames and the ruleset's
# compiled regexes, plus a multiple of the text it was given (frames hold each line a few times over).
MEM_BASE = 400 * MIB
MEM_PER_BYTE = 64
KEY = ["cluster", "job_id", "attempt"]
TRIED = {"jobs": 0, "folders": 0}
# No shrinking by Hypothesis: an input is a seed, and a failing batch is cut down to its failing jobs here.
PROFILE_SETTINGS = dict(deadline=None, derandomize=not LONG, database=None,
                        phases=[Phase.explicit, Phase.reuse, Phase.generate],
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                               HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def seeds(ruleset):
    lines, where = gen.seed_lines(ruleset)
    print(f"fuzz seeds: {where}")
    return lines


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak() -> int:
    """Reset this process's peak RSS (Linux: writing 5 to clear_refs) and return the current RSS in bytes."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _status_kb("VmRSS") * 1024


def peak_growth(rss0: int) -> int:
    return _status_kb("VmHWM") * 1024 - rss0


def by_job(diagnoses: pl.DataFrame) -> dict[tuple, dict]:
    return {(r["cluster"], r["job_id"], r["attempt"]): json.loads(r["diagnosis"]) for r in diagnoses.iter_rows(named=True)}


def check_diagnosis(d: dict) -> None:
    assert d["outcome"] in OUTCOMES, d["outcome"]
    assert d["confidence"] in ("high", "medium", "low")
    assert isinstance(d["culprit"]["nodes"], list) and isinstance(d["evidence"], list)
    json.dumps(d, allow_nan=False)  # what the API answers must be valid JSON


def engine(jobs, logs, cov, ruleset) -> dict[tuple, dict]:
    diagnoses, _ = diagnose_tables(jobs, gen.with_identity(logs), cov, ruleset, diagnosed_at=_at())
    return by_job(diagnoses)


def _at():
    from datetime import datetime, timezone
    return datetime(2026, 11, 21, tzinfo=timezone.utc)


def failing_jobs(jobs, logs, cov, ruleset) -> list[str]:
    """A job of a failing batch that fails on its own, found by halving the batch (a dozen engine calls)."""
    ids = jobs["job_id"].to_list()

    def fails(part: list[str]) -> bool:
        try:
            engine(*[f.filter(pl.col("job_id").is_in(part)) for f in (jobs, logs, cov)], ruleset)
        except Exception:  # noqa: BLE001 - finding what fails is the point
            return True
        return False

    while len(ids) > 1:
        half = ids[: len(ids) // 2]
        if fails(half):
            ids = half
        elif fails(ids[len(ids) // 2:]):
            ids = ids[len(ids) // 2:]
        else:
            return ids  # fails only together
    return ids


@settings(max_examples=BATCHES, **PROFILE_SETTINGS)
@given(seed=st.integers(0, 2**31 - 1))
def test_fleet_batches_of_generated_jobs(seed, ruleset, seeds):
    jobs, logs, cov = gen.fleet_batch(seed, JOBS_PER_BATCH, seeds)
    size = int(logs["line"].str.len_bytes().sum() or 0)
    rss0 = reset_peak()
    try:
        first = engine(jobs, logs, cov, ruleset)
    except Exception as exc:
        bad = failing_jobs(jobs, logs, cov, ruleset)
        raise AssertionError(f"batch seed {seed}: {type(exc).__name__}: {exc}; failing alone: {bad[:5]} "
                             f"(re-make with gen.fleet_batch({seed}, {JOBS_PER_BATCH}, seeds))") from exc
    grown = peak_growth(rss0)
    assert grown <= MEM_BASE + MEM_PER_BYTE * size, (seed, grown, size)
    failed = jobs.filter(pl.col("state").is_in(list(FAILED_STATES)))
    assert sorted(first) == sorted(failed.select(KEY).iter_rows()), seed
    for d in first.values():
        check_diagnosis(d)
    # the same jobs in reverse order: every verdict identical
    order = {j: i for i, j in enumerate(reversed(jobs["job_id"].to_list()))}

    def reverse_jobs(f: pl.DataFrame) -> pl.DataFrame:  # the jobs' order reversed, each job's rows in order
        return (f.with_columns(_o=pl.col("job_id").replace_strict(order, return_dtype=pl.Int64))
                .sort("_o", maintain_order=True).drop("_o"))

    second = engine(jobs.reverse(), reverse_jobs(logs), reverse_jobs(cov), ruleset)
    changed = [k for k in first if first[k] != second.get(k)]
    assert not changed, f"batch seed {seed}: verdicts depend on job order: {changed[:3]}"
    TRIED["jobs"] += jobs.height
    if LONG and TRIED["jobs"] % (10 * JOBS_PER_BATCH) == 0:  # progress of a long run by hand
        print(f"fuzz: {TRIED['jobs']} jobs", flush=True)


# ---------------------------------------------------------------- whole folders through diagnose_files

NAMES = ("node-a/train.log", "gpu017/dmesg", "rank3.log", "slurm-4711.out", "x/y/z/rank_0.err", "événements.log",
         "node-b/syslog.1", "gpu002/rank12.out", " .log", "a" * 200 + ".log", "ip-10-0-0-7/kern.log")
SMALL = ReadLimits(file_bytes=2 * MIB, job_bytes=8 * MIB, job_lines=200_000)


def write_folder(root: Path, rng: random.Random, seeds: list[str]) -> list[Path]:
    """1-6 files of random content and kind (plain, gz/bz2/xz, truncated archives, bombs, a FIFO, links)."""
    made = []
    for i in range(rng.randint(1, 6)):
        rel = rng.choice(NAMES)
        p = root / f"{i}" / rel if rng.random() < 0.3 else root / rel
        if p.exists() or p.is_symlink() or any(q.is_symlink() or q.is_file() for q in p.parents):
            continue  # a name already taken by this folder (a file, or a looping link): another file
        p.parent.mkdir(parents=True, exist_ok=True)
        data = gen.file_bytes(rng, seeds)
        kind = rng.choice(("plain", "plain", "gz", "bz2", "xz", "cut", "bomb", "fifo", "link"))
        if kind in ("gz", "bz2", "xz", "cut", "bomb"):
            algo = rng.choice(("gz", "bz2", "xz")) if kind in ("cut", "bomb") else kind
            comp = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[algo]
            if kind == "bomb":
                data = data[:200] + b"\n" * (3 * MIB)  # inflates past SMALL.file_bytes
            blob = comp(data)
            if kind == "cut":
                blob = blob[: max(1, len(blob) * rng.randint(1, 9) // 10)]
            p = p.with_name(p.name + "." + algo)
            p.write_bytes(blob)
        elif kind == "fifo":
            os.mkfifo(p)
        elif kind == "link":
            p.symlink_to(root / "nowhere" if rng.random() < 0.5 else p)
        else:
            p.write_bytes(data)
        made.append(p)
    return made


@settings(max_examples=FOLDERS, **PROFILE_SETTINGS)
@given(seed=st.integers(0, 2**31 - 1))
def test_folders_of_hostile_files(seed, ruleset, seeds, tmp_path_factory):
    rng = random.Random(seed)
    root = tmp_path_factory.mktemp("fuzz")
    made = write_folder(root, rng, seeds)
    state = rng.choice(("UNKNOWN", "FAILED", "COMPLETED"))
    rss0 = reset_peak()
    ev = collect_files([root], ruleset, job_id="j", state=state, read_limits=SMALL)
    d = run_phases(ev, ruleset, diagnosed_at=AT)[0]
    size = sum(r.bytes for r in ev.files)
    assert peak_growth(rss0) <= MEM_BASE + MEM_PER_BYTE * size
    check_diagnosis(d)
    again = run_phases(collect_files([root], ruleset, job_id="j", state=state, read_limits=SMALL), ruleset,
                       diagnosed_at=AT)[0]
    assert again == d, f"folder seed {seed}: not deterministic"
    # every input not read whole is named in its source's coverage
    reasons = {c["source"]: c["reason"] for c in d["coverage"]}
    reported = {r.path: r for r in ev.files}
    for p in made:
        rep = reported.get(str(p))
        assert rep is not None or any(str(p).startswith(k) or k.startswith(str(p)) for k in reported), (seed, p)
        if rep is not None and (rep.status != "ok" or rep.note()):
            assert Path(rep.path).name in reasons[rep.source], (seed, rep.path, reasons[rep.source])
    TRIED["folders"] += 1


def test_the_profile_tried_enough_inputs():
    if TRIED["jobs"] == 0:
        pytest.skip("the property tests of this module did not run (selected alone?)")
    want = 100_000 if LONG else 20_000
    assert TRIED["jobs"] + TRIED["folders"] >= want, TRIED
    print(f"fuzz profile {PROFILE}: {TRIED['jobs']} generated jobs, {TRIED['folders']} folders")


# ---------------------------------------------------------------- regression inputs (every crash found)

REGRESSIONS = sorted((Path(__file__).parent / "regressions").glob("*.json"))


@pytest.mark.parametrize("case", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_regression_inputs_found_by_fuzzing(case, ruleset, tmp_path):
    """Each input once crashed the diagnose path; both paths (files, fleet tables) must now diagnose it."""
    spec = json.loads(case.read_text())
    p = tmp_path / "job" / "train.log"
    p.parent.mkdir()
    p.write_bytes("\n".join(spec["lines"]).encode("utf-8", "surrogatepass"))
    ev = collect_files([p], ruleset, job_id="r", state=spec["state"])
    check_diagnosis(run_phases(ev, ruleset, diagnosed_at=AT)[0])
    rng_jobs, logs, cov = gen.fleet_batch(0, 1, ["x"])
    logs = pl.DataFrame([{**{k: None for k in logs.columns}, "cluster": "fuzz", "job_id": rng_jobs["job_id"][0],
                          "attempt": rng_jobs["attempt"][0], "source": "applog", "file": "a/train.log", "seq": i,
                          "line": line} for i, line in enumerate(spec["lines"])], schema=logs.schema)
    jobs = rng_jobs.with_columns(state=pl.lit(spec["state"]))
    for d in engine(jobs, logs, cov, ruleset).values():
        check_diagnosis(d)
