"""The native scanner (faultline/_scan.c) gives what the Polars path gives, on random bytes built to defeat it:
lines, their decoding and cuts, counts per node and rank, candidate lines and their node and rank, training
progress, the file's report, and so the symptoms."""

import os
import random

import polars as pl
import pytest

from faultline import native
from faultline.collect_lines import JobMeta, LineCollector
from faultline.collectors import files as filecol
from faultline.logparse import identity_exprs
from faultline.rules.extract import prefilter_literals


def test_the_native_scanner_is_built():
    # `pip install -e .` builds it (setup.py); without a C compiler faultline runs without it, but then
    # this suite would test only one path: say so rather than skip
    if os.environ.get("FAULTLINE_NATIVE", "").lower() in ("off", "0", "no"):
        pytest.skip("FAULTLINE_NATIVE=off: the native scanner is switched off")
    assert native.available(), "faultline._scan is not built (needs a C compiler at `pip install -e .`)"


# Fragments of the prefixes and texts the scanner's shortcuts reason about, and of what breaks lines.
_FRAGMENTS = [
    b"[default3]:", b"[rank12]:", b"[trainer1]:", b"[worker7]:", b"[rank1234567]:", b"[default12345]:",
    b"gpu-node-001:2345:2398 [3] ", b"host_a.b-c:1:2 [12] ", b"x:1:2 [123] ", b"h:12:34 [5]", b":9:9 [1] ",
    b"Dec  1 10:02:13 gpu-node-004 kernel: ", b"Jun 17 09:00:00.123 node7 python[1234]: ", b"messages:",
    b"<13>", b"Jan 1 00:00:00 host prog:", b"2024-06-09T11:49:36+0000 gpu-3 kernel: ", b"[pod/p-1/c] ",
    b"worker-1: ", b"[hgx-b17] ", b"[1,5]<stderr>:", b"[1718000000.123] [gpu-1:42:0] ", b"user@gpu-3:~/r$ ",
    b"(RayTrainWorker pid=4471, ip=10.0.5.12) ", b"[PG 0 Rank 5]", b"Rank 3]", b"Rank 1234567]", b"localRank 5 ",
    b"[Rank 2] ", b"[rank", b"Rank ", b" [", b"] ", b"loss: 2.3", b"Loss=tensor(-1", b"LOSS value: 7", b"loss",
    b"'loss': 1.93", b"lm loss: 2.1E+00", b"loss=abc", b"NCCL INFO Channel 01/0 : 3[3] -> 4[4] via P2P",
    b"Epoch 2:  33%|##   | 331/1000 [00:12<01:26.12, 1.02it/s]", b"\xd9\xa3", b"\xc3\xa9", "\u2713".encode(),
    "\ufffd".encode(), b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x1b[31m", b"\x1b[0m",
    b"\x1b[", b"\x1b", b"\x1b[1;2?3 !m", b"\r", b"\r\n", b"\n", b"\n\n", b" ", b"\t", b"0", b"12", b":", b"a" * 70,
]


def _random_file(rnd: random.Random, literals: list[str]) -> bytes:
    frags = _FRAGMENTS + [lit.encode() for lit in rnd.sample(literals, 30)] + [
        lit.upper().encode() for lit in rnd.sample(literals, 5)]
    out = []
    for _ in range(rnd.randrange(1, 400)):
        out.append(rnd.choice(frags))
        if rnd.random() < 0.3:
            out.append(rnd.choice([b"\n", b"\r\n"]))
    if rnd.random() < 0.2:
        out.append(b"x" * rnd.randrange(0, 6000) + rnd.choice([b"", b"\n", b"\r"]))
    return b"".join(out)


_SCANNER = native.scanner  # the real one: once patched away, `native.scanner` is the patch


def _evidence(ruleset, path, use_native: bool, monkeypatch, **kw):
    monkeypatch.setattr(native, "scanner", _SCANNER if use_native else (lambda literals: None))
    col = LineCollector(ruleset, JobMeta(job_id="j"), 2026)
    col.read_file(path, col.report(str(path), "applog", "file-node", None), **kw)
    ev = col.evidence()
    return ev, col.reports[0]


def _both_paths(ruleset, path, monkeypatch, **kw):
    """The Polars path's evidence of `path`, after asserting the native path gives the same."""
    want, wrep = _evidence(ruleset, path, False, monkeypatch, **kw)
    got, grep = _evidence(ruleset, path, True, monkeypatch, **kw)
    for f in ("bytes", "lines", "status", "reason", "truncated_lines", "replaced_chars"):
        assert getattr(grep, f) == getattr(wrep, f), (path.name, kw, f)
    _same(got.stats, want.stats, ["node", "rank"])
    _same(got.progress, want.progress)
    _same(got.symptoms, want.symptoms)
    return want


def _same(a: pl.DataFrame, b: pl.DataFrame, by: list[str] | None = None) -> None:
    if by:
        a, b = a.sort(by, nulls_last=True), b.sort(by, nulls_last=True)
    assert a.to_dicts() == b.to_dicts()


@pytest.mark.skipif(not native.available(), reason="the native scanner is not built")
def test_native_scanner_gives_the_polars_paths_evidence_on_random_bytes(ruleset, tmp_path, monkeypatch):
    rnd = random.Random(13)
    literals = prefilter_literals(ruleset)
    for k in range(50):
        p = tmp_path / f"f{k}.log"
        p.write_bytes(_random_file(rnd, literals))
        kw = {"block_bytes": rnd.choice([64, 333, 4096, 1 << 20]), "max_line": rnd.choice([40, 100, 1 << 16])}
        _both_paths(ruleset, p, monkeypatch, **kw)


@pytest.mark.skipif(not native.available(), reason="the native scanner is not built")
def test_native_parts_and_threads_give_the_polars_paths_evidence(ruleset, tmp_path, monkeypatch):
    """A block over 64 KiB is scanned as two interleaved parts, over 1 MiB as four on two threads (cut at
    line breaks, \r\n and lone \r included): the same evidence as the Polars path, in file order."""
    rnd = random.Random(29)
    literals = prefilter_literals(ruleset)
    p = tmp_path / "big.log"
    p.write_bytes(b"\r".join(_random_file(rnd, literals) for _ in range(650)) + b"no final break")
    assert p.stat().st_size > (1 << 20) + (1 << 19)
    for kw in ({"block_bytes": 4 << 20, "max_line": 1 << 16}, {"block_bytes": 150 << 10, "max_line": 100}):
        want = _both_paths(ruleset, p, monkeypatch, **kw)
    assert want.symptoms.height > 100 and want.progress.height == 1


@pytest.mark.skipif(not native.available(), reason="the native scanner is not built")
def test_native_keys_parse_as_their_lines(ruleset):
    """Every line's who-spoke key has the line's node and rank (checked line by line: one line per piece)."""
    rnd = random.Random(5)
    sc = native.scanner(tuple(prefilter_literals(ruleset)))
    lines, keys = [], []
    for _ in range(4000):
        starts = [rnd.choice(_FRAGMENTS[:16]) for _ in range(rnd.randrange(0, 3))]  # prefixes come first
        line = b"".join(starts + [rnd.choice(_FRAGMENTS[:60]) for _ in range(rnd.randrange(1, 6))])
        line = line.replace(b"\n", b" ").replace(b"\r", b" ")
        d = native.scan(sc, [], line + b"\n", 1 << 16, (1 << 16) + 56)
        assert d.lines == 1 and len(d.keys) == 1
        lines.append(filecol._decode(line, filecol.FileReport("x", "applog", None, None)))
        keys.append(d.keys[0])
    by_line = pl.DataFrame({"line": lines}).select(**identity_exprs())
    by_key = pl.DataFrame({"_k": keys}).select(**identity_exprs(column="_k"))
    bad = [(ln, k) for ln, k, a, b in zip(lines, keys, by_line.rows(), by_key.rows()) if a != b]
    assert not bad, bad[:5]
    assert sum(k != ln for k, ln in zip(keys, lines)) > 800  # the shortcuts were taken, not only whole lines


@pytest.mark.skipif(not native.available(), reason="the native scanner is not built")
def test_native_job_line_limit_cuts_where_the_polars_path_cuts(ruleset, tmp_path, monkeypatch):
    from dataclasses import replace

    from faultline.limits import CLI_READ

    p = tmp_path / "a.log"
    p.write_bytes(b"".join(b"[rank%d]: step %d loss: 2.0 \xff\n" % (i % 8, i) for i in range(5000)))
    lim = replace(CLI_READ, job_lines=1234)
    want, wrep = _evidence(ruleset, p, False, monkeypatch, limits=lim, block_bytes=4096)
    got, grep = _evidence(ruleset, p, True, monkeypatch, limits=lim, block_bytes=4096)
    assert (grep.lines, grep.status, grep.reason, grep.replaced_chars) == (wrep.lines, wrep.status, wrep.reason,
                                                                          wrep.replaced_chars)
    assert grep.lines == 1234
    _same(got.stats, want.stats, ["node", "rank"])
    _same(got.progress, want.progress)


def test_pieces_give_read_blocks_lines(tmp_path):
    """read_blocks is pieces() split and decoded: the native path reads the same pieces."""
    rnd = random.Random(3)
    for k in range(20):
        data = b"".join(rnd.choice(_FRAGMENTS) for _ in range(rnd.randrange(1, 300)))
        p = tmp_path / f"p{k}.log"
        p.write_bytes(data)
        rep = filecol.FileReport(str(p), "applog", None, None)
        n = sum(len(pre) + (len(filecol._split(bytes(b).decode("utf-8", "replace"))) - 1 if len(b) else 0)
                for pre, b in filecol.pieces(p, rep, 128, 40))
        rep2 = filecol.FileReport(str(p), "applog", None, None)
        assert n == sum(f.height for f in filecol.read_blocks(p, rep2, 128, 40))


def _count_readers(monkeypatch) -> list:
    made = []
    real = native.Reader

    def counting(*a, **kw):
        made.append(a[0])
        return real(*a, **kw)
    monkeypatch.setattr(native, "Reader", counting)
    return made


@pytest.mark.skipif(not native.available(), reason="the native scanner is not built")
def test_a_prestarted_read_is_used_only_where_it_reads_what_the_collector_would(ruleset, tmp_path, monkeypatch):
    """The CLI starts the first file's read before Polars is imported (native.prestart): the collector takes
    that read over where it was started with its own file, limits and block size, and reads anew otherwise;
    the evidence is the same either way."""
    from faultline.pipeline import collect_files

    rnd = random.Random(41)
    literals = prefilter_literals(ruleset)
    (tmp_path / "job").mkdir()
    for name in ("a.log", "b.log"):
        (tmp_path / "job" / name).write_bytes(b"\n".join(_random_file(rnd, literals) for _ in range(40)))
    paths = [tmp_path / "job"]

    def rows(ev):
        return [ev.symptoms.to_dicts(), ev.stats.sort("node", "rank", nulls_last=True).to_dicts(),
                ev.coverage.to_dicts(), ev.progress.sort("file").to_dicts()]

    made = _count_readers(monkeypatch)
    want = rows(collect_files(paths, ruleset, block_bytes=4096))
    assert len(made) == 2  # one read per file
    made.clear()
    pre = native.prestart(paths, ruleset, block_bytes=4096)
    assert pre is not None and len(made) == 1
    assert rows(collect_files(paths, ruleset, block_bytes=4096, prestarted=pre)) == want
    assert len(made) == 2 and not pre.reader._thread.is_alive()  # the prestarted read served the first file
    made.clear()
    pre = native.prestart(paths, ruleset, block_bytes=8192)  # not what the collector reads with
    assert rows(collect_files(paths, ruleset, block_bytes=4096, prestarted=pre)) == want
    assert len(made) == 3 and not pre.reader._thread.is_alive()  # read anew; the prestarted thread was stopped


@pytest.mark.skipif(not native.available(), reason="the native scanner is not built")
def test_a_read_stopped_early_ends_its_thread(ruleset, tmp_path):
    p = tmp_path / "a.log"
    p.write_bytes(b"[rank1]: step 1 loss: 2.0 NCCL WARN x\n" * 20000)
    sc = native.scanner(tuple(prefilter_literals(ruleset)))
    rep = filecol.FileReport(str(p), "applog", None, None)
    r = native.Reader(p, rep, sc, 4096, 1 << 16, 1 << 40, 1 << 30)
    first = next(iter(r))
    assert first.lines > 0 and rep.bytes >= 4096
    r.close()
    assert not r._thread.is_alive()
    r2 = native.Reader(p, filecol.FileReport(str(p), "applog", None, None), sc, 4096, 1 << 16, 1 << 40, 1 << 30)
    r2.close()  # never read from: the thread stops though its queue is full
    assert not r2._thread.is_alive()


@pytest.mark.skipif(not native.available(), reason="the native scanner is not built")
def test_a_read_error_comes_where_it_happened(ruleset, tmp_path, monkeypatch):
    """A gzip file damaged in its middle: the pieces before the damage are kept and the error is the file's
    status, on the native path (where the read runs in a thread) as on the Polars path."""
    import gzip

    rnd = random.Random(8)
    literals = prefilter_literals(ruleset)
    raw = b"\n".join(_random_file(rnd, literals) for _ in range(300))
    packed = bytearray(gzip.compress(raw, 1))
    mid = len(packed) * 3 // 4
    packed[mid:mid + 64] = rnd.randbytes(64)
    p = tmp_path / "damaged.log.gz"
    p.write_bytes(bytes(packed))
    want = _both_paths(ruleset, p, monkeypatch, block_bytes=1 << 16, max_line=1 << 16)
    cov = want.coverage.filter(pl.col("source") == "applog").row(0, named=True)
    assert cov["status"] == "error" and cov["rows"] > 0 and "damaged.log.gz: error" in cov["reason"]


def test_minimal_literals_are_those_holding_no_other():
    from faultline.rules.literals import _minimal_literals

    rnd = random.Random(17)
    for _ in range(300):
        lits = tuple(sorted({"".join(rnd.choice("abAB. ") for _ in range(rnd.randrange(1, 7)))
                             for _ in range(rnd.randrange(1, 40))}))
        assert _minimal_literals(lits) == tuple(x for x in lits if not any(o != x and o in x for o in lits))


def test_the_native_read_needs_no_polars(tmp_path):
    """The CLI reads the first file while Polars is imported: the modules that read natively, and a ruleset
    from its cache, must not import Polars themselves (or the read would wait for it)."""
    import subprocess
    import sys

    env = {**os.environ, "FAULTLINE_CACHE_DIR": str(tmp_path / "cache")}
    p = tmp_path / "a.log"
    p.write_text("gpu-node-1:1:2 [0] NCCL WARN Net : Connection closed by remote peer\n")
    code = ("import sys\nfrom faultline import native\nfrom faultline.rules.loader import load_ruleset\n"
            "pre = native.prestart([sys.argv[1]], load_ruleset())\nd = next(iter(pre.reader))\npre.close()\n"
            "assert d.lines == 1 and len(d.cand_index) == 1 or not native.available(), d\n"
            "print('polars' in sys.modules)")
    subprocess.run([sys.executable, "-c", code, str(p)], env=env, check=True, capture_output=True)  # fills the cache
    out = subprocess.run([sys.executable, "-c", code, str(p)], env=env, check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(not native.available(), reason="the native scanner is not built")
def test_native_route_finds_every_literal_a_line_holds():
    """`route` against a brute-force search (ASCII case folding, as the extract prefilter): literals short and
    longer than the automaton's 8-byte heads, sharing heads, inside each other, overlapping, cut at a line's
    end; lines with non-ASCII text, ESC and case variants."""
    rnd = random.Random(5)
    for _ in range(200):
        lits = sorted({"".join(rnd.choice("abc.") for _ in range(rnd.randrange(1, 14))) for _ in range(rnd.randrange(1, 30))})
        rt = native.router(tuple(lits))
        lines = ["".join(rnd.choice(["a", "B", "c", ".", "C", "é", "\x1b", "\u2713", " "] + lits)
                         for _ in range(rnd.randrange(0, 12))) for _ in range(50)]
        rows, hit = native.route(rt, lines)
        got = sorted(zip(rows, hit))
        want = sorted((i, j) for i, line in enumerate(lines) for j, lit in enumerate(lits)
                      if lit.encode() in line.encode().lower())
        assert got == want and rows == sorted(rows)


@pytest.mark.skipif(not native.available(), reason="the native scanner is not built")
def test_native_routes_are_the_polars_routes(ruleset, monkeypatch):
    """extract's routing of candidate lines to their rules: the same (rule, row) pairs from the native automaton
    as from Polars' extract_many, on lines built from the rules' own literals (case changed, cut short)."""
    from faultline.rules import extract

    rnd = random.Random(11)
    lits = sorted({lit for r in ruleset.log_rules for lit in r.log.literals})
    frags = [f.decode("utf-8", "replace") for f in _FRAGMENTS] + lits + [x.upper() for x in lits[::7]] + [
        x[:-1] for x in lits[::5]] + [x.title() for x in lits[::11]]
    lines = ["".join(rnd.choice(frags) for _ in range(rnd.randrange(1, 8))) for _ in range(3000)]
    text = pl.DataFrame({"_row": pl.Series(range(len(lines)), dtype=pl.UInt32), "line": lines, "source": "applog"})
    native_routes = extract._routes(text, ruleset.log_rules)
    monkeypatch.setattr(native, "router", lambda literals: None)
    polars_routes = extract._routes(text, ruleset.log_rules)
    assert native_routes.height > 3000 and native_routes.equals(polars_routes)


@pytest.mark.skipif(not native.available(), reason="the native scanner is not built")
def test_the_scans_routes_are_route_of_its_candidates(ruleset):
    """The scan routes each part's candidates in the thread that scanned it: the pairs are `route` of the
    digest's candidate lines, rows counted over the parts before (1, 2, 4 and 8 parts, decoded lines first)."""
    from faultline.rules.literals import route_literals

    rnd = random.Random(17)
    literals = prefilter_literals(ruleset)
    sc, rt = native.scanner(tuple(literals)), native.router(tuple(route_literals(ruleset.log_rules)[0]))
    data = b"\n".join(_random_file(rnd, literals) for _ in range(900))
    data = data[:data.rfind(b"\n") + 1]
    assert len(data) > 2 << 20
    pre = ["NCCL WARN first", "nothing", "Xid 79 fell off the bus"]
    for size, threads in ((50 << 10, 2), (200 << 10, 1), (900 << 10, 1), (len(data), 2)):
        piece = data[:data.rfind(b"\n", 0, size) + 1]
        d = native.scan(sc, pre, piece, 1 << 16, (1 << 16) + 80, threads=threads, rt=rt)
        plain = native.scan(sc, pre, piece, 1 << 16, (1 << 16) + 80, threads=threads)
        assert len(d.cand_text) > 100 and plain.route_rows is None
        assert (d.route_rows, d.route_lits) == native.route(rt, d.cand_text), (size, threads)
        assert d._replace(route_rows=None, route_lits=None) == plain
