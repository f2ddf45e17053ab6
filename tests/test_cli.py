import json
import shutil

import pytest

from faultline.cli import main
from faultline.evaluate import evaluate

from .conftest import CORPUS

DIAGNOSIS_KEYS = {"cluster", "job_id", "attempt", "outcome", "domain", "root_cause", "culprit", "affected",
                  "ambiguous", "candidates", "confidence", "evidence", "recommended_action", "coverage",
                  "ruleset", "diagnosed_at"}
OOM = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def test_diagnose_json_has_the_design_keys(write, capsys):
    p = write("job/train.log", "[rank0]: step 1", OOM)
    assert main(["diagnose", str(p.parent), "--format", "json"]) == 1  # a failure with a named cause
    d = json.loads(capsys.readouterr().out)
    assert DIAGNOSIS_KEYS <= set(d)
    assert d["outcome"] == "cuda_oom" and d["culprit"]["ranks"] == [1]
    assert d["evidence"][0]["line"] == OOM and d["evidence"][0]["line_no"] == 2
    assert d["ruleset"]["version"] and d["job_id"] == "job"


def test_diagnose_human_output_is_short_and_names_the_culprit(write, capsys):
    p = write("train.log", OOM)
    assert main(["diagnose", str(p)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("CUDA_OOM") and "rank 1" in out and OOM[:60] in out
    assert len(out.splitlines()) < 20


def test_diagnose_of_nothing_is_a_clear_error(tmp_path, capsys):
    assert main(["diagnose", str(tmp_path / "nope.log")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_the_command_leaves_diagnose_with_its_output_and_status(write, tmp_path):
    """`python -m faultline` and the console script leave `diagnose` by os._exit (cli.main's exit_now): the
    output is whole, through a pipe and into a file, and the exit status is the diagnosis's."""
    import subprocess
    import sys

    p = write("train.log", "[rank0]: step 1", OOM)
    proc = subprocess.run([sys.executable, "-m", "faultline", "diagnose", str(p), "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and json.loads(proc.stdout)["outcome"] == "cuda_oom"
    out = tmp_path / "out.txt"
    with out.open("w") as fh:
        proc = subprocess.run([sys.executable, "-m", "faultline", "diagnose", str(p)], stdout=fh, timeout=300)
    assert proc.returncode == 1 and out.read_text().startswith("CUDA_OOM") and out.read_text().endswith("\n")
    proc = subprocess.run([sys.executable, "-m", "faultline", "diagnose", str(tmp_path / "nope.log")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_rules_commands(capsys):
    assert main(["rules", "list"]) == 0
    assert "rules in" in capsys.readouterr().out
    assert main(["rules", "lint"]) == 0


@pytest.mark.skipif(not CORPUS.is_dir(), reason="shared corpus not beside the project")
def test_eval_scores_a_case_and_counts_wrong_blames(tmp_path, ruleset, capsys):
    shutil.copytree(CORPUS / "003", tmp_path / "003")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "log.txt").write_text(OOM + "\n")
    (tmp_path / "bad" / "truth.yaml").write_text("outcome_category: healthy\nculprit: null\n")
    results = {r.case: r for r in evaluate(tmp_path, ruleset)}
    assert results["003"].outcome_right and results["003"].culprit_right
    assert not results["bad"].outcome_right and results["bad"].wrong_blame  # a culprit on a healthy job
    assert main(["eval", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "outcome accuracy: 1/2" in out and "wrong blames: 1" in out and "healthy -> cuda_oom: 1" in out


def test_scenario_demo_gets_every_worked_example_right(tmp_path, capsys):
    assert main(["demo", "--scenarios", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "6/6 verdicts match the injected faults" in out and "MISMATCH" not in out


@pytest.mark.skipif(not CORPUS.is_dir(), reason="shared corpus not beside the project")
def test_development_corpus_stays_right_with_no_wrong_blame(ruleset):
    results = evaluate(CORPUS, ruleset)
    assert len(results) >= 14
    assert sum(r.outcome_right for r in results) >= len(results) - 1  # issue 2: at least 13 of 14
    assert not [r.case for r in results if r.wrong_blame]


def test_eval_never_takes_a_case_folders_name_for_a_node(tmp_path, ruleset):
    # `N-013` reads like an LSF host (`n-62-20-2`); as a corpus case's folder it is the harness's name
    case = tmp_path / "N-013"
    case.mkdir()
    (case / "log.txt").write_text("ImportError: libcudart.so.12: cannot open shared object file: No such file or directory\n")
    (case / "truth.yaml").write_text("outcome_category: config_error\nculprit: null\n")
    (r,) = evaluate(tmp_path, ruleset)
    assert r.outcome == "config_error" and r.culprit["nodes"] == [] and not r.wrong_blame
