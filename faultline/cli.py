"""The `faultline` command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from faultline import taxonomy


def _ruleset(args):
    from faultline.rules.loader import RulesetError, load_ruleset

    try:
        return load_ruleset([Path(p) for p in getattr(args, "rules", None) or []],
                            builtin=not getattr(args, "no_builtin", False))
    except RulesetError as exc:
        print(f"faultline: the rule packs have {len(exc.problems)} problem(s):", file=sys.stderr)
        for p in exc.problems:
            print(f"  {p}", file=sys.stderr)
        raise SystemExit(2) from None


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


def cmd_diagnose(args) -> int:
    from faultline.pipeline import diagnose_files
    from faultline.render import render

    ruleset = _ruleset(args)
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing and len(missing) == len(args.paths):
        print(f"faultline: no such file or folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    d = diagnose_files(args.paths, ruleset, job_id=args.job_id or Path(args.paths[0]).name,
                       cluster=args.cluster, state=args.state)
    if args.format == "json":
        print(json.dumps(d, sort_keys=False, default=str))
    else:
        print(render(d, color=sys.stdout.isatty()))
    return 0


def cmd_eval(args) -> int:
    from dataclasses import asdict

    from faultline.evaluate import confusion_table, evaluate, summarize

    ruleset = _ruleset(args)
    results = evaluate(Path(args.dir), ruleset)
    if not results:
        print(f"faultline: no case folders with truth.yaml under {args.dir}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps({"cases": [asdict(r) for r in results], "confusion": confusion_table(results)}))
    else:
        print(summarize(results))
    return 0


def cmd_demo(args) -> int:
    from faultline.demo import run_demo

    return run_demo(_ruleset(args), Path(args.data_dir))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faultline", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    demo = sub.add_parser("demo", help="diagnose built-in failure scenarios end to end")
    demo.add_argument("--data-dir", default="data", help="where the demo writes its jobs and diagnoses")
    demo.add_argument("--rules", action="append", help="extra rule pack folder (repeatable)")
    demo.set_defaults(func=cmd_demo)

    diag = sub.add_parser("diagnose", help="diagnose one job from its log files and folders")
    diag.add_argument("paths", nargs="+", help="files (plain, .gz, .bz2, .xz) and folders of one job")
    diag.add_argument("--format", choices=["human", "json"], default="human")
    diag.add_argument("--job-id", help="job id to report (default: the first path's name)")
    diag.add_argument("--cluster", default="local")
    diag.add_argument("--state", default="UNKNOWN", choices=list(taxonomy.JOB_STATES),
                      help="the scheduler's state of the job, if known")
    diag.add_argument("--rules", action="append", help="extra rule pack folder (repeatable)")
    diag.set_defaults(func=cmd_diagnose)

    ev = sub.add_parser("eval", help="score verdicts against case folders holding truth.yaml")
    ev.add_argument("dir")
    ev.add_argument("--format", choices=["human", "json"], default="human")
    ev.add_argument("--rules", action="append", help="extra rule pack folder (repeatable)")
    ev.set_defaults(func=cmd_eval)

    rules = sub.add_parser("rules", help="list, test and lint the rule packs")
    rules.add_argument("rules_cmd", choices=["list", "test", "lint"])
    rules.add_argument("--rules", action="append", help="extra rule pack folder (repeatable)")
    rules.add_argument("--no-builtin", action="store_true", help="load only the --rules packs")
    rules.add_argument("--pack", help="list: only this pack")
    rules.add_argument("--only", help="test: only rules whose id starts with this")
    rules.set_defaults(func=cmd_rules)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
