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
        return load_ruleset([Path(p) for p in getattr(args, "rules", None) or []])
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
        print(f"ok: {len(ruleset.rules)} rules, every outcome covered, ruleset {ruleset.version}")
        return 0
    from faultline.rules.testing import run_rule_tests

    count, failures = run_rule_tests(ruleset, only=args.only)
    for f in failures:
        print(f"FAIL {f}")
    passed = count - len(failures)
    print(f"rules: {passed} passed, {len(failures)} failed")
    return 1 if failures else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faultline", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    rules = sub.add_parser("rules", help="list, test and lint the rule packs")
    rules.add_argument("rules_cmd", choices=["list", "test", "lint"])
    rules.add_argument("--rules", action="append", help="extra rule pack folder (repeatable)")
    rules.add_argument("--pack", help="list: only this pack")
    rules.add_argument("--only", help="test: only rules whose id starts with this")
    rules.set_defaults(func=cmd_rules)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
