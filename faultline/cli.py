"""The `faultline` command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from faultline import limits, taxonomy


def _ruleset(args):
    from faultline.rules.loader import RulesetError, load_ruleset

    try:
        return load_ruleset([Path(p) for p in getattr(args, "rules", None) or []],
                            builtin=not getattr(args, "no_builtin", False))
    except RulesetError as exc:
        _print_ruleset_problems(exc)
        raise SystemExit(2) from None


def _print_ruleset_problems(exc) -> None:
    print(f"faultline: the rule packs have {len(exc.problems)} problem(s):", file=sys.stderr)
    for p in exc.problems:
        print(f"  {p}", file=sys.stderr)


def cmd_rules(args) -> int:
    ruleset = _ruleset(args)
    if args.rules_cmd == "list":
        for r in ruleset.rules:
            if args.pack and r.pack != args.pack:
                continue
            print(f"{r.id:48} {r.status:12} {r.emits.role:12} {r.emits.outcome:28} {r.title}")
        print(f"{len(ruleset.rules)} rules in {len(ruleset.packs)} packs, ruleset {ruleset.version}")
        return 0
    if args.rules_cmd == "lint":
        covered = {r.emits.outcome for r in ruleset.rules if r.status == "stable" and r.tests_match}
        lookups = {row.get("outcome") for r in ruleset.rules if r.lookup and r.status == "stable"
                   for row in r.lookup.rows}
        missing = [o for o in taxonomy.OUTCOMES if o not in covered | lookups and o not in ("healthy", "unknown")]
        if missing:
            print(f"no stable rule emits: {', '.join(missing)}", file=sys.stderr)
            return 1
        from faultline.rules.testing import shadowing

        ties, shadowed = shadowing(ruleset)
        for line in shadowed:
            print(f"note: {line}")
        if ties:
            print("\n".join(f"tie: {t}" for t in ties), file=sys.stderr)
            print(f"{len(ties)} test line(s) where rules of equal priority disagree on the outcome", file=sys.stderr)
            return 1
        print(f"ok: {len(ruleset.rules)} rules, every outcome covered, no priority ties, ruleset {ruleset.version}")
        return 0
    from faultline.rules.testing import run_rule_tests

    count, failures = run_rule_tests(ruleset, only=args.only)
    for f in failures:
        print(f"FAIL {f}")
    passed = count - len(failures)
    print(f"rules: {passed} passed, {len(failures)} failed")
    return 1 if failures else 0


def default_job_id(paths: list[str]) -> tuple[str, bool]:
    """The Slurm id of a `slurm-<id>.out` among the inputs, else the first path's name (a guess that
    the job's own Slurm lines may correct). Returns (job id, guessed)."""
    from faultline.collectors.files import slurm_job_id

    sid = slurm_job_id(paths)
    return (sid, False) if sid else (Path(paths[0]).resolve().name, True)


# `faultline diagnose` exit status, for scripts (README "Exit status").
EXIT_HEALTHY, EXIT_FAILURE, EXIT_USAGE, EXIT_UNKNOWN, EXIT_AMBIGUOUS = 0, 1, 2, 3, 4


def exit_status(d: dict) -> int:
    """0 healthy; 1 a failure with a named cause; 3 unknown (failed or unreadable, cause not named);
    4 ambiguous (several causes fit: human review). 2 is a usage error (argparse's own code)."""
    if d["ambiguous"]:
        return EXIT_AMBIGUOUS
    return {"healthy": EXIT_HEALTHY, "unknown": EXIT_UNKNOWN}.get(d["outcome"], EXIT_FAILURE)


def cmd_diagnose(args) -> int:
    from faultline import native

    ruleset = _ruleset(args)  # from its cache, without Polars
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing and len(missing) == len(args.paths):
        print(f"faultline: no such file or folder: {', '.join(missing)}", file=sys.stderr)
        return EXIT_USAGE
    job_id, guessed = (args.job_id, False) if args.job_id else default_job_id(args.paths)
    # The first file's native scan starts before Polars is imported (~0.25 s): they run side by side.
    pre = native.prestart(args.paths, ruleset)
    try:
        from faultline.pipeline import diagnose_files
        from faultline.render import render

        d = diagnose_files(args.paths, ruleset, job_id=job_id, job_id_guessed=guessed,
                           cluster=args.cluster, state=args.state, exit_code=args.exit_code, prestarted=pre)
    finally:
        if pre is not None:
            pre.close()
    if args.format == "json":
        print(json.dumps(d, sort_keys=False, default=str))
    else:
        print(render(d, color=sys.stdout.isatty()))
    return exit_status(d)


def cmd_eval(args) -> int:
    from dataclasses import asdict

    from faultline.evaluate import confusion_table, evaluate, summarize

    ruleset = _ruleset(args)
    problems: list[str] = []
    results = evaluate(Path(args.dir), ruleset, split=args.split, problems=problems)
    for why in problems:
        print(f"faultline: case left out: {why}", file=sys.stderr)
    if not results:
        print(f"faultline: no case folders with truth.yaml under {args.dir}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps({"cases": [asdict(r) for r in results], "confusion": confusion_table(results)}))
    else:
        print(summarize(results))
    return 0


def cmd_demo(args) -> int:
    from faultline.demo import run_demo, run_fleet_demo

    if args.scenarios:
        return run_demo(_ruleset(args), Path(args.data_dir))
    return run_fleet_demo(Path(args.data_dir), jobs=args.jobs, days=args.days, seed=args.seed)


def cmd_sql(args) -> int:
    from faultline.warehouse.store import QueryError, Warehouse, WarehouseError

    root = Path(args.data_dir) / "warehouse"
    try:
        wh = Warehouse(root, create=False)
        df = wh.sql(args.query, limit=args.limit + 1 if args.limit and args.limit > 0 else None)
    except QueryError as exc:
        print(f"faultline: SQL error: {exc}", file=sys.stderr)
        return 2
    except WarehouseError as exc:
        print(f"faultline: {exc}", file=sys.stderr)
        return 2
    truncated = bool(args.limit and args.limit > 0 and df.height > args.limit)
    if truncated:
        df = df.head(args.limit)
    print(_format_frame(df, args.format))
    if truncated:
        print(f"faultline: showing the first {args.limit} rows (--limit)", file=sys.stderr)
    return 0


def _format_frame(df, fmt: str) -> str:
    import polars as pl

    def plain(v):
        if isinstance(v, list):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v.isoformat() if hasattr(v, "isoformat") else v

    if fmt == "json":
        return json.dumps([plain(r) for r in df.to_dicts()], default=str)
    if fmt == "csv":
        nested = [c for c, t in df.schema.items() if t.is_nested()]
        if nested:  # CSV has no lists: write them as JSON text
            df = df.with_columns(pl.col(c).map_elements(lambda v: json.dumps(plain(v.to_list() if hasattr(v, "to_list") else v), default=str),
                                                        return_dtype=pl.String) for c in nested)
        return df.write_csv().rstrip("\n")
    with pl.Config(tbl_rows=-1, tbl_cols=-1, fmt_str_lengths=120, fmt_table_cell_list_len=8,
                   tbl_width_chars=65_000, tbl_hide_dataframe_shape=True):
        return f"{df}\n({df.height} row{'s' if df.height != 1 else ''})"


def cmd_flow(args) -> int:
    from faultline.flows.env import configure_prefect

    configure_prefect(args.data_dir)
    from faultline.flows import runner
    from faultline.flows.server import prefect_api

    # the flows choose their task runner when imported (faultline.flows.runner)
    if getattr(args, "dask_address", None):
        os.environ[runner.ADDRESS_ENV] = args.dask_address
    if getattr(args, "dask_workers", None):
        os.environ[runner.WORKERS_ENV] = str(args.dask_workers)
    with prefect_api():
        return _run_flow(args)


def _run_flow(args) -> int:
    from faultline.flows import flows

    common = {"data_dir": args.data_dir}
    if args.flow == "collect":
        out = flows.collect(start=args.start, end=args.end, **common)
    elif args.flow == "diagnose":
        if args.start or args.end:
            print("faultline: flow diagnose has no window: it diagnoses every collected failed job not yet "
                  "diagnosed with the current ruleset (re-run a window with `flow backtest`)", file=sys.stderr)
            return 2
        out = flows.diagnose(rules=args.rules, **common)
    elif args.flow == "report":
        out = flows.report(day=args.day, days=args.days, **common)
    elif args.flow == "job":
        if not (args.cluster and args.job_id):
            print("faultline: flow job needs --cluster and --job-id", file=sys.stderr)
            return 2
        from faultline.fleet.single import JobNotFinished, JobNotFound, SourceError
        try:
            out = flows.diagnose_job(cluster=args.cluster, job_id=args.job_id, **common)
        except (JobNotFound, JobNotFinished, SourceError) as exc:  # a clear answer, not a traceback
            print(f"faultline: {exc}", file=sys.stderr)
            return 1
    elif args.flow == "placements":
        out = flows.record_placements(clusters=[args.cluster] if args.cluster else None, **common)
    else:
        if not args.rules:
            print("faultline: flow backtest needs --rules DIR (the candidate packs)", file=sys.stderr)
            return 2
        out = flows.backtest(candidate_rules=args.rules, start=args.start, end=args.end,
                             builtin=not args.no_builtin, **common)
    print(json.dumps(out, default=str, indent=1))
    return 0


def cmd_backfill(args) -> int:
    from faultline.fleet.config import ConfigError
    from faultline.flows.env import configure_prefect

    configure_prefect(args.data_dir)
    from faultline.flows import flows
    from faultline.flows.server import prefect_api

    try:
        with prefect_api():
            out = flows.backfill(since=args.since, until=args.until, data_dir=args.data_dir)
    except ConfigError as exc:
        print(f"faultline: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out, default=str, indent=1))
    return 0


def cmd_serve(args) -> int:
    import logging

    import uvicorn

    from faultline.fleet.config import ConfigError
    from faultline.rules.loader import RulesetError
    from faultline.service.app import create_app
    from faultline.service.settings import Settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_args(args)
        app = create_app(settings)
    except RulesetError as exc:
        _print_ruleset_problems(exc)
        return 2
    except (ConfigError, ValueError) as exc:
        print(f"faultline: {exc}", file=sys.stderr)
        return 2
    from faultline.service.server import uvicorn_config

    config = uvicorn_config(app, settings, host=args.host, port=args.port,
                            ssl_certfile=args.tls_cert, ssl_keyfile=args.tls_key, ssl_ca_certs=args.tls_client_ca,
                            ssl_client_cert_required=bool(args.tls_client_ca))
    uvicorn.Server(config).run()
    return 0


def cmd_token(args) -> int:
    """Make a bearer token: the token once on stdout's first line, then the entry for the tokens file."""
    from faultline.service.auth import SCOPES, hash_token, new_token

    scopes = [x.strip() for x in args.scopes.split(",") if x.strip()]
    if not scopes or any(x not in SCOPES for x in scopes):
        print(f"faultline: --scopes are some of {', '.join(SCOPES)}", file=sys.stderr)
        return 2
    token = new_token()
    print(token)
    print(f"# add to the tokens file (the token itself is not kept anywhere):\n"
          f"  - name: {args.name}\n    sha256: {hash_token(token)}\n    scopes: [{', '.join(scopes)}]")
    return 0


def cmd_serve_flows(args) -> int:
    from faultline.flows.env import configure_prefect

    configure_prefect(args.data_dir)
    from prefect import serve

    from faultline.flows.deployments import build_all
    from faultline.flows.server import prefect_api

    with prefect_api():
        serve(*build_all({"data_dir": args.data_dir}))
    return 0


def cmd_simulate(args) -> int:
    from faultline.simulate import SimConfig, export_cases, simulate

    cfg = SimConfig(jobs=args.jobs, days=args.days, clusters=args.clusters, seed=args.seed, start=args.start)
    if args.export_cases:
        export_cases(Path(args.export_cases), cfg, args.limit)
        if args.out is None:
            return 0
    out = Path(args.out or "sim")
    summary = simulate(out, cfg)
    print(f"faultline simulate: {summary['jobs']} job attempts ({summary['failed']} failed), "
          f"{summary['lines']} log lines, {summary['node_events']} node events in {summary['seconds']} s -> {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faultline", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    demo = sub.add_parser("demo", help="simulate a fleet and run collect -> diagnose -> report through Prefect")
    demo.add_argument("--data-dir", default="data", help="where the demo writes its jobs and diagnoses")
    demo.add_argument("--jobs", type=int, default=3000)
    demo.add_argument("--days", type=int, default=3)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--scenarios", action="store_true", help="only the worked examples, without Prefect")
    demo.add_argument("--rules", action="append", help="extra rule pack folder (repeatable)")
    demo.set_defaults(func=cmd_demo)

    diag = sub.add_parser("diagnose", help="diagnose one job from its log files and folders")
    diag.add_argument("paths", nargs="+", help="files (plain, .gz, .bz2, .xz) and folders of one job")
    diag.add_argument("--format", choices=["human", "json"], default="human")
    diag.add_argument("--job-id", help="job id to report (default: the first path's name)")
    diag.add_argument("--cluster", default="local")
    diag.add_argument("--state", default="UNKNOWN", choices=list(taxonomy.JOB_STATES),
                      help="the scheduler's state of the job, if known")
    diag.add_argument("--exit-code", type=int, help="the job's exit code, if known")
    diag.add_argument("--rules", action="append", help="extra rule pack folder (repeatable)")
    diag.set_defaults(func=cmd_diagnose)

    ev = sub.add_parser("eval", help="score verdicts against case folders holding truth.yaml")
    ev.add_argument("dir")
    ev.add_argument("--format", choices=["human", "json"], default="human")
    ev.add_argument("--split", choices=["dev", "test"],
                    help="only the cases of one side (each case's `split`, else fixed by a hash of its source_url)")
    ev.add_argument("--rules", action="append", help="extra rule pack folder (repeatable)")
    ev.set_defaults(func=cmd_eval)

    fl = sub.add_parser("flow", help="run one fleet flow through Prefect (ephemeral unless a server is configured)")
    fl.add_argument("flow", choices=["collect", "diagnose", "report", "job", "backtest", "placements"],
                    help="placements: one pass of the placement recorder (Kubernetes clusters; --cluster for one)")
    fl.add_argument("--data-dir", default="data")
    fl.add_argument("--start", help="collect/backtest: window start (ISO time, UTC); collect's default: "
                                    "its cursor less the scheduler lag; backtest's: a day before --end")
    fl.add_argument("--end", help="collect/backtest: window end (ISO time, UTC); default: now")
    fl.add_argument("--day", help="report: the last day of the report (default yesterday)")
    fl.add_argument("--days", type=int, default=7, help="report: how many days")
    fl.add_argument("--cluster")
    fl.add_argument("--job-id")
    fl.add_argument("--rules", action="append", help="diagnose/backtest: extra or candidate rule pack folder")
    fl.add_argument("--no-builtin", action="store_true", help="backtest: the candidate is only the --rules packs")
    fl.add_argument("--dask-address", help="run the partition tasks on this Dask scheduler (tcp://host:8786; "
                                           "needs faultline[dask] there and the same data dir path)")
    fl.add_argument("--dask-workers", type=int, help="run the partition tasks on a local Dask cluster of N processes")
    fl.set_defaults(func=cmd_flow)

    bf = sub.add_parser("backfill", help="collect and diagnose history from a date (day by day, a no-op when re-run)")
    bf.add_argument("--since", required=True, help="first instant to collect (ISO date or time, UTC)")
    bf.add_argument("--until", help="last instant (default: now)")
    bf.add_argument("--data-dir", default="data")
    bf.set_defaults(func=cmd_backfill)

    api = sub.add_parser("serve", help="the HTTP API: diagnose jobs, read stored diagnoses (docs/service.md)")
    api.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    api.add_argument("--port", type=int, default=8080)
    api.add_argument("--config", help="fleet config for diagnosis by reference and stored diagnoses "
                                      "(a faultline.yaml or its data dir; default: data/faultline.yaml if present)")
    api.add_argument("--max-body-mb", type=float, default=limits.MAX_BODY_MB, help="largest request body in MiB (413 past it)")
    api.add_argument("--workers-max", type=int, default=limits.WORKERS_MAX, help="diagnoses run at once; more requests queue")
    api.add_argument("--queue-timeout", type=float, default=limits.QUEUE_TIMEOUT_S,
                     help="seconds a request may wait for a free worker before 503 (default 30)")
    api.add_argument("--tmp-dir", help="where uploaded logs are written while diagnosed (default: system temp)")
    api.add_argument("--max-json-mb", type=float, default=limits.MAX_JSON_MB, help="largest JSON body in MiB (413 past it; default 64)")
    api.add_argument("--allowed-host", action="append",
                     help="a Host header name to answer besides the loopback names (repeatable; '*' for any)")
    api.add_argument("--allowed-origin", action="append",
                     help="a browser origin (https://ops.example.org) allowed to send POSTs (repeatable)")
    api.add_argument("--header-timeout", type=float, default=limits.HEADER_TIMEOUT_S, help="seconds to receive a request head (default 10)")
    api.add_argument("--read-timeout", type=float, default=limits.READ_TIMEOUT_S,
                     help="longest pause in seconds between two pieces of a body before 408 (default 15)")
    api.add_argument("--body-timeout", type=float, default=limits.BODY_TIMEOUT_S,
                     help="longest time in seconds to receive a whole body before 408 (default 300)")
    api.add_argument("--keep-alive", type=int, default=limits.KEEP_ALIVE_S, help="seconds an idle connection is kept (default 5)")
    api.add_argument("--max-connections", type=int, default=limits.MAX_CONNECTIONS, help="open connections at once (503 past it)")
    api.add_argument("--max-decompressed-mb", type=float, default=limits.SERVICE_DECOMPRESSED_MB,
                     help="MiB of text one request's files may yield after decompression (past it the text is cut "
                          "and the coverage says where; default %(default)s)")
    api.add_argument("--max-lines", type=int, default=limits.SERVICE_MAX_LINES,
                     help="lines one request's files may yield (past it: cut, in the coverage; default %(default)s)")
    api.add_argument("--tokens", help="bearer tokens file (name, sha256, scopes, limits; default $FAULTLINE_TOKENS; "
                                      "none: no authentication)")
    api.add_argument("--sessions-db", help="DuckDB file of the sessions (default <data dir>/service/sessions.duckdb)")
    api.add_argument("--session-ttl-hours", type=float, default=24, help="a session expires this long after its last change")
    api.add_argument("--max-sessions", type=int, default=1000, help="sessions kept at once (429 past it)")
    api.add_argument("--max-session-lines", type=int, default=limits.SESSION_LINES, help="log lines one session may hold (413 past it)")
    api.add_argument("--max-session-mb", type=float, default=limits.SESSION_MB, help="MiB of log text one session may hold (413 past it)")
    api.add_argument("--drains-per-cluster-hour", type=int, default=4,
                     help="action guard: node actions approved per cluster in any hour (default 4)")
    api.add_argument("--drains-per-job", type=int, default=2, help="action guard: nodes of one job (default 2)")
    api.add_argument("--drain-max-fraction", type=float, default=0.25,
                     help="action guard: never more than this share of a job's nodes (default 0.25)")
    api.add_argument("--webhook-url", help="POST every final session verdict here (HMAC-SHA256 signed with "
                                           "$FAULTLINE_WEBHOOK_SECRET; retried with backoff)")
    api.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    api.add_argument("--tls-key", help="the certificate's private key (PEM)")
    api.add_argument("--tls-client-ca", help="require client certificates signed by this CA (mutual TLS)")
    api.add_argument("--rules", action="append", help="extra rule pack folder (repeatable; default: the config's rules)")
    api.add_argument("--no-builtin", action="store_true", help="load only the --rules packs")
    api.set_defaults(func=cmd_serve)

    tok = sub.add_parser("token", help="make a bearer token for `faultline serve --tokens` (prints it and its hash entry)")
    tok.add_argument("token_cmd", choices=["new"])
    tok.add_argument("--name", required=True, help="the name the audit log shows for this token")
    tok.add_argument("--scopes", default="read,diagnose", help="comma-separated: read, diagnose, admin")
    tok.set_defaults(func=cmd_token)

    sv = sub.add_parser("serve-flows", help="serve the deployments of prefect.yaml (schedules, event trigger)")
    sv.add_argument("--data-dir", default="data")
    sv.set_defaults(func=cmd_serve_flows)

    sim = sub.add_parser("simulate", help="write a synthetic fleet with injected faults (docs/fleet.md)")
    sim.add_argument("--out", help="output folder (default: sim; with --export-cases only if given)")
    sim.add_argument("--jobs", type=int, default=5000, help="number of jobs (before requeues)")
    sim.add_argument("--days", type=int, default=14, help="days the jobs are submitted over")
    sim.add_argument("--clusters", type=int, default=2)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--start", default="2025-03-03", help="first day (YYYY-MM-DD, UTC)")
    sim.add_argument("--export-cases", metavar="DIR", help="write failed jobs as case folders for `faultline eval`")
    sim.add_argument("--limit", type=int, default=40, help="--export-cases: number of failed jobs")
    sim.set_defaults(func=cmd_simulate)

    rules = sub.add_parser("rules", help="list, test and lint the rule packs")
    rules.add_argument("rules_cmd", choices=["list", "test", "lint"])
    rules.add_argument("--rules", action="append", help="extra rule pack folder (repeatable)")
    rules.add_argument("--no-builtin", action="store_true", help="load only the --rules packs")
    rules.add_argument("--pack", help="list: only this pack")
    rules.add_argument("--only", help="test: only rules whose id starts with this")
    rules.set_defaults(func=cmd_rules)

    sql = sub.add_parser("sql", help="ad hoc SQL (DuckDB) over the warehouse tables")
    sql.add_argument("query", help='e.g. "SELECT outcome, count(*) FROM diagnoses GROUP BY 1"')
    sql.add_argument("--data-dir", default="data", help="the warehouse is <data-dir>/warehouse")
    sql.add_argument("--format", choices=["table", "csv", "json"], default="table")
    sql.add_argument("--limit", type=int, default=1000, help="print at most this many rows (0: all)")
    sql.set_defaults(func=cmd_sql)
    return parser


def main(argv: list[str] | None = None, exit_now: bool = False) -> int:
    """`exit_now` (the command's entry points, not callers in-process): `diagnose` leaves by os._exit once its
    output is flushed. The interpreter's teardown (a collection of the cyclic garbage that holds the job's
    frames, every module's objects, Polars' memory handed back) was 0.05-0.1 s of a 209 MiB log's run
    (bench/README.md, bigfile, seventh round); diagnose leaves no file, thread or exit hook to finish
    (logging's flush of stderr is the one hook, and stderr is flushed here)."""
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
        if exit_now and args.func is cmd_diagnose:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        return status
    except BrokenPipeError:  # `faultline diagnose ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def run() -> int:
    """The `faultline` console script."""
    return main(exit_now=True)


if __name__ == "__main__":
    sys.exit(run())
