"""The NVIDIA Xid catalog -> packs/nvidia/xids.csv conversion (faultline.rules.xid_catalog)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from faultline import taxonomy
from faultline.rules import xid_catalog as xc
from faultline.rules.loader import load_ruleset

CATALOG = Path(__file__).parents[1].parent / "shared" / "reference" / "nvidia-xid-catalog"
PACK = Path(xc.__file__).parent / "packs" / "nvidia"
TABLE = PACK / "xids.csv"

needs_catalog = pytest.mark.skipif(not (CATALOG / "xids.csv").is_file(), reason=f"no catalog at {CATALOG}")


def committed() -> dict[str, dict[str, str]]:
    with TABLE.open(newline="", encoding="utf-8") as fh:
        return {row["key"]: row for row in csv.DictReader(fh)}


@needs_catalog
def test_regenerating_from_the_catalog_gives_the_committed_table():
    assert xc.generate(CATALOG) == TABLE.read_text(encoding="utf-8"), (
        "packs/nvidia/xids.csv is stale: run python -m faultline.rules.xid_catalog "
        f"{CATALOG} {TABLE}")


@needs_catalog
def test_cli_entry_writes_the_table(tmp_path):
    out = tmp_path / "xids.csv"
    assert xc.main([str(CATALOG), str(out)]) == 0
    assert out.read_text(encoding="utf-8") == TABLE.read_text(encoding="utf-8")
    assert xc.main([]) == 2


def test_table_columns_order_and_vocabulary():
    with TABLE.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames) == xc.COLUMNS
        rows = list(reader)
    keys = [int(r["key"]) for r in rows]
    assert keys == sorted(keys) and len(keys) == len(set(keys))
    for r in rows:
        assert r["role"] in taxonomy.ROLES
        assert r["domain"] in taxonomy.DOMAINS
        assert r["implicates"] in taxonomy.IMPLICATES
        assert r["outcome"] in taxonomy.OUTCOMES
        assert r["action"] in taxonomy.ACTIONS
        assert 0 <= int(r["priority"]) <= 100
        assert r["summary"].startswith(f"Xid {r['key']} ") and "{gpu_pci}" in r["summary"]
        # A machine is blamed only by hardware/infrastructure rows; workload rows never take a node out.
        if r["domain"] in ("workload", "software"):
            assert r["action"] not in taxonomy.NODE_ACTIONS
        if r["role"] == "context":
            assert r["implicates"] == "none"


@pytest.mark.parametrize("code, symptom, role, outcome, implicates, action", [
    ("48", "gpu_uncorrectable_memory", "root", "gpu_hardware", "self", "reset_gpu"),
    ("63", "gpu_row_remap_event", "context", "healthy", "none", "no_action"),
    ("64", "gpu_row_remap_failure", "root", "gpu_hardware", "self", "reset_gpu"),
    ("74", "nvlink_error", "root", "nvlink", "self", "reset_gpu"),
    ("79", "gpu_fallen_off_bus", "root", "gpu_hardware", "self", "drain_node"),
    ("94", "gpu_uncorrectable_memory", "root", "gpu_hardware", "self", "restart"),
    ("95", "gpu_uncorrectable_memory", "root", "gpu_hardware", "self", "reset_gpu"),
    ("140", "gpu_uncorrectable_memory", "root", "gpu_hardware", "self", "reset_gpu"),
    ("119", "xid", "root", "gpu_driver_xid_other", "self", "reset_gpu"),
    ("120", "xid", "root", "gpu_driver_xid_other", "self", "reset_gpu"),
    ("13", "xid_app_fault", "confirmation", "user_code_error", "none", "fix_and_resubmit"),
    ("31", "xid_app_fault", "confirmation", "user_code_error", "none", "fix_and_resubmit"),
    ("43", "xid_app_fault", "confirmation", "user_code_error", "none", "fix_and_resubmit"),
    ("45", "xid_app_teardown", "teardown", "unknown", "none", "human_review"),
    ("144", "nvlink_error", "root", "nvlink", "self", "reset_gpu"),
    ("149", "nvlink_error", "root", "nvlink", "self", "reset_gpu"),
    ("150", "nvlink_error", "root", "nvlink", "self", "reset_gpu"),
    ("154", "xid_info", "context", "healthy", "none", "no_action"),
    ("92", "xid_info", "context", "healthy", "none", "no_action"),
])
def test_key_codes(code, symptom, role, outcome, implicates, action):
    row = committed()[code]
    assert (row["symptom"], row["role"], row["outcome"], row["implicates"], row["action"]) == (
        symptom, role, outcome, implicates, action)


def test_hardware_outranks_driver_outranks_application():
    t = committed()
    prio = lambda code: int(t[code]["priority"])  # noqa: E731
    assert prio("79") > prio("48") > prio("74") > prio("119") > prio("13") > prio("45")
    assert t["13"]["domain"] == "workload" and t["79"]["domain"] == "hardware"


def _row(code="900", mnemonic="SOMETHING_NEW", description="New thing", immediate="", investigatory=""):
    return xc.CatalogRow(code=code, mnemonic=mnemonic, description=description,
                         immediate=immediate, investigatory=investigatory, notes="")


@pytest.mark.parametrize("row, expected", [
    (_row(immediate="RESTART_APP", investigatory="CHECK_APP/CUDA"), "application"),
    (_row(immediate="RESTART_APP", investigatory="CONTACT_SUPPORT"), "engine_fault"),
    (_row(immediate="RESET_GPU", investigatory="CONTACT_SUPPORT"), "gpu_fault"),
    (_row(mnemonic="NVLINK_FOO_ERROR", immediate="RESET_GPU", investigatory="CONTACT_SUPPORT"), "nvlink"),
    (_row(immediate="RESET_GPU", investigatory="INVESTIGATE_LINK_SI"), "nvlink"),
    (_row(immediate="IGNORE", investigatory="INVESTIGATE_LINK_SI"), "benign"),
    (_row(immediate="CHECK_UVM", investigatory="SYMPATHETIC_REPORT_SOLO"), "sympathetic"),
    (_row(immediate="CONTACT_SUPPORT", description="Unused"), "unused"),
    (_row(immediate="RESTART_BM"), "gpu_lost"),
    (_row(mnemonic="NVLINK_NEW_ERR"), "nvlink"),
    (_row(mnemonic="PSHC_SOMETHING"), "benign"),
    (_row(mnemonic="UNCORRECTABLE_SRAM_ERROR"), "gpu_memory_detail"),
    (_row(mnemonic="MYSTERY"), "unused"),
    (_row(code="63", immediate="RESET_GPU"), "remap_event"),  # explicit overrides beat the buckets
])
def test_classify_from_catalog_columns(row, expected):
    assert xc.classify(row)[0] == expected


def test_every_bucket_in_the_catalog_is_mapped():
    """A new immediate bucket in a catalog release must be added to the tables, not silently 'unused'."""
    if not (CATALOG / "xids.csv").is_file():
        pytest.skip("no catalog")
    for row in xc.read_catalog(CATALOG):
        assert not row.immediate or row.immediate in xc.IMMEDIATE_CLASS, (row.code, row.immediate)


def test_nvidia_pack_loads_the_table():
    rs = load_ruleset()  # with every pack: its supersedes name symptoms of the pytorch, nccl and kernel packs
    rule = rs.by_id()["nvidia.xid"]
    assert rule.lookup is not None and rule.lookup.capture == "xid"
    assert len(rule.lookup.rows) == len(committed())
