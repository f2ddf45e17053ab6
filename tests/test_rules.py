"""The packs' own tests, and the loader's promises: every problem at once, with its place."""

import textwrap
from pathlib import Path

import pytest

from faultline import taxonomy
from faultline.rules.loader import RulesetError, load_ruleset
from faultline.rules.testing import run_rule_tests


def test_every_rule_passes_its_own_tests(ruleset):
    count, failures = run_rule_tests(ruleset)
    assert count > 3 * len(ruleset.log_rules) / 2
    assert not failures, "\n".join(map(str, failures))


def test_every_rule_has_tests_and_every_outcome_a_stable_rule(ruleset):
    assert all(r.tests_match for r in ruleset.rules)
    outcomes = {r.emits.outcome for r in ruleset.rules if r.status == "stable"}
    outcomes |= {row.get("outcome") for r in ruleset.rules if r.lookup for row in r.lookup.rows}
    missing = set(taxonomy.OUTCOMES) - outcomes - {"healthy", "unknown"}
    assert not missing


def test_no_two_rules_of_equal_priority_disagree_on_a_line(ruleset):
    from faultline.rules.testing import shadowing

    ties, _ = shadowing(ruleset)
    assert not ties, "\n".join(ties)


def test_job_state_rules_are_tested_like_log_rules(tmp_path):
    pack = tmp_path / "sched"
    pack.mkdir()
    (pack / "j.yaml").write_text(textwrap.dedent("""\
        rules:
          - id: site.timeout
            title: t
            description: d
            status: stable
            match: {job: {states: [TIMEOUT]}}
            emits: {symptom: s, role: root, domain: scheduler, implicates: none, outcome: scheduler_timelimit}
            tests:
              match: [{job: {state: TIMEOUT}, outcome: scheduler_timelimit}, {job: {state: FAILED}}]
              no_match: [{job: {state: TIMEOUT}}]
        """))
    count, failures = run_rule_tests(load_ruleset([tmp_path], builtin=False))
    assert count == 3
    assert sorted(f.message for f in failures) == ["did not match", "matched a line it must not match"]


def test_ruleset_version_is_a_content_hash(tmp_path):
    pack = tmp_path / "mine"
    pack.mkdir()
    (pack / "a.yaml").write_text(GOOD)
    v1 = load_ruleset([tmp_path], builtin=False).version
    assert load_ruleset([tmp_path], builtin=False).version == v1
    (pack / "a.yaml").write_text(GOOD.replace("stable", "test"))
    assert load_ruleset([tmp_path], builtin=False).version != v1


GOOD = textwrap.dedent("""\
    rules:
      - id: site.gpu_fell_over
        title: Site-specific GPU failure message
        status: stable
        description: Our health agent prints this when a GPU stops answering.
        match:
          log:
            literals: ["gpu fell over"]
            regex: 'GPU fell over on (?P<node>[\\w-]+)'
        emits: {symptom: site_gpu, role: root, domain: hardware, implicates: self, outcome: gpu_hardware}
        priority: 90
        action: drain_node
        tests:
          match:
            - line: "healthd: GPU fell over on gpu042"
              node: gpu042
          no_match: ["GPU is fine on gpu042"]
""")


def test_loader_reports_every_problem_with_file_and_line(tmp_path):
    pack = tmp_path / "broken"
    pack.mkdir()
    (pack / "a.yaml").write_text(textwrap.dedent("""\
        rules:
          - id: Bad Id
            title: x
            description: y
            match: {log: {literals: ["ab"], regex: "unclosed("}}
            emits: {symptom: s, role: boss, domain: hardware, implicates: peer, outcome: nope}
          - id: ok.no_tests
            title: x
            description: y
            match: {log: {literals: ["abc"], regex: "abc"}}
            emits: {symptom: s, role: root, domain: hardware, implicates: self, outcome: gpu_hardware}
          - id: ok.bad_places
            title: x
            description: y
            match: {log: {literals: ["abc"], regex: "abc"}}
            emits: {symptom: h, role: context, domain: unknown, implicates: none, outcome: unknown}
            places: {symptoms: [no_such_symptom], within: 0, gives: [gpu]}
            section: {symptoms: [s], within: 10, role: boss}
            at_startup: {outcome: nope, summary: "{nothing}", color: red}
            refuted_by_ranks: "yes"
            tests: {match: ["abc"]}
        """))
    (pack / "b.yaml").write_text("rules: [\n")
    with pytest.raises(RulesetError) as err:
        load_ruleset([tmp_path], builtin=False)
    text = str(err.value)
    for needle in ("a.yaml:2", "id 'Bad Id'", "does not compile", "emits.role 'boss'", "emits.outcome 'nope'",
                   "implicates=peer needs emits.peer", "3+ characters", "a.yaml:7", "has no tests",
                   "b.yaml", "not valid YAML", "places.within", "places.gives",
                   "places unknown rule or symptom 'no_such_symptom'", "section.role 'boss'",
                   "at_startup is a mapping", "at_startup.outcome 'nope'", "at_startup.summary uses {nothing}",
                   "refuted_by_ranks is true or false"):
        assert needle in text, needle


def test_a_builtin_pack_loads_alone_but_an_operator_typo_in_supersedes_does_not(tmp_path):
    from faultline.rules.loader import BUILTIN_PACKS
    # slurm's task-exit lines supersede the outside-stop symptoms of the pytorch/python packs
    alone = load_ruleset([BUILTIN_PACKS / "slurm"], builtin=False)
    exit_code = next(r for r in alone.rules if r.id == "slurm.srun_task_exit_code")
    assert "torchrun_agent_signal" in exit_code.supersedes
    pack = tmp_path / "mine"
    pack.mkdir()
    (pack / "a.yaml").write_text(textwrap.dedent("""\
        rules:
          - id: mine.x
            title: x
            description: y
            match: {log: {literals: ["abc"], regex: "abc"}}
            emits: {symptom: s, role: root, domain: hardware, implicates: self, outcome: gpu_hardware}
            supersedes: [no_such_symptom]
            tests: {match: ["abc"]}
        """))
    with pytest.raises(RulesetError, match="supersedes unknown rule or symptom 'no_such_symptom'"):
        load_ruleset([pack], builtin=False)


def test_a_line_implicating_a_peer_it_does_not_name_needs_a_header_that_gives_one(tmp_path):
    victim = """\
          - id: mine.victim
            title: x
            description: y
            match: {log: {literals: ["worker died"], regex: "worker died"}}
            emits: {symptom: v, role: cascade, domain: unknown, implicates: peer, outcome: unknown}
            tests: {match: ["worker died"]}
        """
    header = """\
          - id: mine.header
            title: x
            description: y
            match: {log: {literals: ["ip:"], regex: "ip: (?P<ip>[0-9.]+)"}}
            emits: {symptom: h, role: context, domain: unknown, implicates: none, peer: ip, outcome: unknown}
            places: {symptoms: [v], within: 2, gives: [PEER]}
            tests: {match: ["ip: 10.0.0.7"]}
        """
    for gives, loads in (("peer", True), ("node", False)):
        pack = tmp_path / f"mine_{gives}"
        pack.mkdir()
        (pack / "a.yaml").write_text("rules:\n" + textwrap.dedent(victim) + textwrap.dedent(header.replace("PEER", gives)))
        if loads:
            rules = load_ruleset([pack], builtin=False).by_id()
            assert rules["mine.victim"].emits.implicates == "peer" and not rules["mine.victim"].emits.peer
        else:
            with pytest.raises(RulesetError, match="or a header whose places gives peer to its symptom"):
                load_ruleset([pack], builtin=False)


def test_a_fragment_is_written_once_and_read_by_every_regex_that_names_it(tmp_path):
    """`{{python_line_prefix}}` is a built-in fragment: an operator's rule reads a vLLM-prefixed traceback
    line through it; a fragment that is unknown, defined twice or broken is reported with its place."""
    from faultline.rules.loader import BUILTIN_PACKS
    pack = tmp_path / "site"
    pack.mkdir()
    (pack / "a.yaml").write_text(textwrap.dedent("""\
        rules:
          - id: site.quota_refused
            title: x
            description: y
            match: {log: {literals: ["quotaerror"], regex: "^{{python_line_prefix}}QuotaError: (?P<detail>.*)$"}}
            emits: {symptom: quota, role: root, domain: workload, implicates: self, outcome: config_error}
            tests:
              match:
                - line: "(EngineCore_DP0 pid=7) ERROR 07-31 16:03:52 [core.py:710] QuotaError: project over quota"
                  detail: project over quota
                - line: "[rank3]: QuotaError: no GPUs left"
                  rank: 3
              no_match: ["see QuotaError: in the docs"]
        """))
    merged = load_ruleset([BUILTIN_PACKS / "python", pack], builtin=False)
    assert "{{" not in merged.by_id()["site.quota_refused"].log.regex
    count, failures = run_rule_tests(merged)
    assert count and not failures, failures
    (pack / "b.yaml").write_text(textwrap.dedent("""\
        fragments:
          python_line_prefix: "x"
          broken: "unclosed("
          Bad-Name: "y"
        rules:
          - id: site.other
            title: x
            description: y
            match: {log: {literals: ["abc"], regex: "{{no_such}}abc"}}
            emits: {symptom: o, role: root, domain: workload, implicates: self, outcome: config_error}
            tests: {match: ["abc"]}
        """))
    with pytest.raises(RulesetError) as err:
        load_ruleset([BUILTIN_PACKS / "python", pack], builtin=False)
    text = str(err.value)
    for needle in ("b.yaml:2 (fragment python_line_prefix): fragment 'python_line_prefix' is defined twice",
                   "(fragment broken): fragment does not compile", "(fragment Bad-Name): a fragment name",
                   "uses unknown fragment {{no_such}}"):
        assert needle in text, needle


def test_operator_pack_overrides_builtin_rule_by_id(tmp_path, ruleset):
    pack = tmp_path / "site"
    pack.mkdir()
    some = ruleset.log_rules[0]
    (pack / "o.yaml").write_text(GOOD.replace("site.gpu_fell_over", some.id))
    merged = load_ruleset([tmp_path])
    assert merged.by_id()[some.id].pack == "site"
    assert len(merged.rules) == len(ruleset.rules)


def test_failing_rule_test_is_reported(tmp_path):
    pack = tmp_path / "mine"
    pack.mkdir()
    (pack / "a.yaml").write_text(GOOD.replace("node: gpu042", "node: gpu043").replace(
        '["GPU is fine on gpu042"]', '["GPU fell over on gpu1"]'))
    count, failures = run_rule_tests(load_ruleset([tmp_path], builtin=False))
    assert count == 2
    assert sorted(f.message for f in failures) == ["matched a line it must not match",
                                                   "node: expected 'gpu043', got 'gpu042'"]


def test_no_literal_fires_on_ordinary_training_chatter(ruleset):
    """The prefilter is only fast if its literals are rare in healthy logs: a literal such as "inf"
    (in every "NCCL INFO") once made extract 20x slower. Each literal may hit few lines of a healthy run."""
    import polars as pl

    from pathlib import Path

    lines = pl.Series(Path(__file__).with_name("data").joinpath("healthy_training.log").read_text().splitlines())
    # Address maps read init chatter on purpose (one NCCL line per rank); every other literal is a
    # failure word. The sample gives each kind of chatter equal weight, so a limit of 10% still
    # catches a literal that is in most lines of a kind.
    literals = sorted({lit for r in ruleset.log_rules if not r.emits.address for lit in r.log.literals})
    hits = {lit: int(lines.str.contains_any([lit], ascii_case_insensitive=True).sum()) for lit in literals}
    noisy = {lit: n for lit, n in hits.items() if n > 0.10 * lines.len()}
    assert not noisy, noisy


def test_ruleset_cache_is_keyed_by_the_pack_content(tmp_path, monkeypatch):
    import shutil

    from faultline.rules.loader import load_ruleset

    monkeypatch.setenv("FAULTLINE_CACHE_DIR", str(tmp_path / "cache"))
    pack = tmp_path / "ops"
    shutil.copytree(Path(__file__).resolve().parents[1] / "faultline/rules/packs/generic", pack)
    first = load_ruleset([pack], builtin=False)
    assert len(list((tmp_path / "cache").glob("ruleset-*.pickle"))) == 1
    again = load_ruleset([pack], builtin=False)
    assert again.version == first.version and [r.id for r in again.rules] == [r.id for r in first.rules]
    f = pack / "markers.yaml"
    f.write_text(f.read_text().replace("priority: 3\n", "priority: 4\n", 1))
    changed = load_ruleset([pack], builtin=False)
    assert changed.version != first.version
    assert sorted(r.priority for r in changed.rules) != sorted(r.priority for r in first.rules)
    # a cache that cannot be written is not used, and nothing fails
    monkeypatch.setenv("FAULTLINE_CACHE_DIR", "/proc/no-such-place")
    assert load_ruleset([pack], builtin=False).version == changed.version


def test_a_cached_ruleset_carries_its_prefilter_literals(tmp_path, monkeypatch):
    """The loader computes the minimal literals before it caches a ruleset: read from the cache they are
    there already (not recomputed at every start) and the same as computed anew."""
    import shutil

    from faultline.rules import literals
    from faultline.rules.loader import load_ruleset

    monkeypatch.setenv("FAULTLINE_CACHE_DIR", str(tmp_path / "cache"))
    pack = tmp_path / "ops"
    shutil.copytree(Path(__file__).resolve().parents[1] / "faultline/rules/packs/generic", pack)
    load_ruleset([pack], builtin=False)
    cached = load_ruleset([pack], builtin=False)
    assert "minimal_literals" in cached.__dict__
    anew = literals._minimal_literals.__wrapped__(tuple(sorted({lit for r in cached.log_rules for lit in r.log.literals})))
    assert literals.prefilter_literals(cached) == list(anew) and len(anew) > 5


def test_torchs_activation_checkpoint_warning_is_not_a_candidate(ruleset):
    """torch/utils/checkpoint.py warns on every rank and step of an activation-checkpointed run; the
    checkpoint-frames rule wants MMCV's runner/checkpoint.py, so a bare "checkpoint.py" literal made these
    lines most of a big log's candidates (bench/README.md, bigfile, sixth round)."""
    from faultline.rules.literals import prefilter_literals

    line = ("[rank3]: /opt/conda/lib/python3.11/site-packages/torch/utils/checkpoint.py:91: UserWarning: None of "
            "the inputs have requires_grad=True. Gradients will be None").lower()
    assert not [lit for lit in prefilter_literals(ruleset) if lit.lower() in line]
    mm = '  File "/usr/lib/python3/site-packages/mmengine/runner/checkpoint.py", line 5, in load_checkpoint'.lower()
    assert [lit for lit in prefilter_literals(ruleset) if lit.lower() in mm]


def test_a_driver_failed_status_line_is_not_a_candidate(ruleset):
    """mlx5 and other drivers print `... failed, status ...` in ordinary console chatter; the sacct-row rule
    wants FAILED followed by a column separator, so its bare "FAILED" literal made these lines 83% of a big
    log's candidates (bench/README.md, bigfile, seventh round). A sacct row of any separator still is one."""
    from faultline.rules.literals import prefilter_literals

    lits = [lit.lower() for lit in prefilter_literals(ruleset)]
    line = ("Dec  1 10:00:00 gpu-node-004 kernel: [39000.003500] mlx5_core 0000:0c:00.0: mlx5_cmd_out_err:838: "
            "QUERY_VPORT_COUNTER(0x770) op_mod(0x0) failed, status bad parameter(0x3), syndrome (0x2e4d9c)").lower()
    assert not [lit for lit in lits if lit in line]
    for row in ("4242  train  gpu  ml  64  FAILED  1:0", "4242|train|gpu|ml|64|FAILED|1:0", "4242\ttrain\tFAILED\t1:0"):
        assert [lit for lit in lits if lit in row.lower()], row


def test_few_candidates_in_a_big_combined_logs_chatter(ruleset, tmp_path):
    """Every candidate line pays for its string, routing and extract, so a literal that ordinary chatter holds
    (a bare "checkpoint.py", "failed", "137": bench/README.md, bigfile) shows in the whole command's time.
    50,000 lines of the bigfile benchmark's torchrun log: the rules that read NCCL's init chatter on purpose
    (address maps) aside, candidates stay under 0.5% of the lines (0.24% when this test was written, most of
    them the injected failure near the end; 3.1% with the bare "failed")."""
    import sys

    import polars as pl

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from bigfile import make_bigfile

    log = tmp_path / "big.log"
    make_bigfile(log, 50_000)
    lines = pl.Series(log.read_text().splitlines())
    literals = sorted({lit for r in ruleset.log_rules if not r.emits.address for lit in r.log.literals})
    n = int(lines.str.contains_any(literals, ascii_case_insensitive=True).sum())
    assert n < 0.005 * lines.len(), n
