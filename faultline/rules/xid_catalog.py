"""Turn NVIDIA's Xid catalog into the lookup table of the `nvidia.xid` rule.

The catalog (one row per Xid code: mnemonic, description, immediate and
investigatory resolution buckets, trigger notes) says what the driver expects an
operator to do. A diagnosis needs something else: is the Xid a *cause* of a failed
job (and of which outcome), a corroboration, a consequence, or benign chatter, and
does it blame the node that logged it? This module makes that translation from the
catalog's own columns through the readable tables below, so a new catalog release is
re-classified by running

    python -m faultline.rules.xid_catalog SRC_DIR OUT_CSV

(SRC_DIR holds xids.csv; OUT_CSV is packs/nvidia/xids.csv). Pure functions, no I/O
except `read_catalog` and `write_table`.

Order of decision for one code (first that applies):
1. CODE_OVERRIDES: the few codes the project taxonomy names explicitly (DESIGN.md:
   gpu_hardware = Xid 48, 64 failure, 79, 94, 95, 140; nvlink = 74, 144-150; Xid 63
   is a benign row-remap event; Xid 45 is teardown), or where a catalog trigger note
   contradicts the bucket (Xid 43/137 are application faults, Xid 32 is PCIe).
2. Empty buckets (codes newer than the bucket columns): MNEMONIC_HINTS on the mnemonic.
3. Immediate bucket RESTART_APP: INVESTIGATORY_REFINES on the investigatory bucket
   tells an application fault (CHECK_APP/CUDA, WORKFLOW_XID_13/31) from an engine
   exception of unknown origin (CONTACT_SUPPORT ...).
4. Investigatory buckets that name a class by themselves (link signal integrity ->
   nvlink; "sympathetic, report solo" -> sympathetic).
5. IMMEDIATE_CLASS on the immediate bucket; CONTACT_SUPPORT rows described "Unused"
   become `unused`.
Then nvlink-ness from the mnemonic (NVLINK_*) turns a generic GPU fault into nvlink.
"""

from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass
from pathlib import Path

COLUMNS = ("key", "symptom", "role", "domain", "implicates", "outcome", "summary", "action", "priority", "title",
           "supersedes")

# What a hardware Xid explains when it is in the same job: the CUDA/NCCL errors its victims print
# and the PCIe noise around a GPU that left the bus. They are consequences, not competing causes.
_GPU_CONSEQUENCES = ("cuda_launch_failure cuda_illegal_memory_access cuda_unknown_error cuda_error "
                     "nccl_unhandled_cuda_error nccl_cuda_failure")
SUPERSEDES: dict[str, str] = {
    "gpu_fallen_off_bus": f"pcie_aer_fatal cuda_no_device {_GPU_CONSEQUENCES}",
    "gpu_pcie_fatal": f"pcie_aer_fatal {_GPU_CONSEQUENCES}",
    "gpu_uncorrectable_memory": f"cuda_ecc_error {_GPU_CONSEQUENCES}",
    "gpu_row_remap_failure": f"cuda_ecc_error {_GPU_CONSEQUENCES}",
    "nvlink_error": f"cuda_nvlink_error {_GPU_CONSEQUENCES}",
}


@dataclass(frozen=True)
class XidClass:
    """How one kind of Xid reads in a failed job."""

    symptom: str
    role: str  # root | confirmation | cascade | teardown | context
    domain: str
    implicates: str  # self: the node (and GPU at the PCI id) that logged it; none: nobody
    outcome: str
    priority: int
    meaning: str  # second half of the summary sentence
    action: str = ""  # fixed action; empty: from the immediate bucket (IMMEDIATE_ACTION)


# What each class means for a diagnosis. `self` blames the node whose kernel logged the
# Xid (the GPU is named by its PCI bus id in the captures); application-class Xids
# blame nobody: the kernel line names a PID, not a rank, and the fault lives in the
# program, which would fail the same way on any healthy GPU.
CLASSES: dict[str, XidClass] = {
    "gpu_lost": XidClass(
        "gpu_fallen_off_bus", "root", "hardware", "self", "gpu_hardware", 95,
        "the driver can no longer reach this GPU over PCIe; ranks on it die and every other rank then "
        "times out waiting for them. Drain the node for a reboot and a hardware check.",
        "drain_node"),
    "pcie_fatal": XidClass(
        "gpu_pcie_fatal", "root", "hardware", "self", "gpu_hardware", 93,
        "a fatal PCIe timeout cut this GPU off from the host; the ranks on it fail and the others time out.",
        "drain_node"),
    "gpu_memory": XidClass(
        "gpu_uncorrectable_memory", "root", "hardware", "self", "gpu_hardware", 92,
        "an uncorrectable GPU memory (ECC) error on this GPU: a hardware fault; the rank using it fails "
        "and the others then time out."),
    "gpu_memory_detail": XidClass(
        "gpu_uncorrectable_memory", "confirmation", "hardware", "self", "gpu_hardware", 90,
        "details (DRAM or SRAM) of an uncorrectable memory error that Xid 48 reports on this GPU.",
        "reset_gpu"),
    "remap_failure": XidClass(
        "gpu_row_remap_failure", "root", "hardware", "self", "gpu_hardware", 90,
        "the GPU could not remap a failing memory row (no spare rows left): a hardware fault; the GPU "
        "needs a reset and likely replacement."),
    "remap_event": XidClass(
        "gpu_row_remap_event", "context", "hardware", "none", "healthy", 90,
        "the GPU remapped a memory row after an ECC error and waits for a reset to activate it; by itself "
        "it does not fail a job (an uncorrectable error is reported by its own Xid 48/94/95).",
        "no_action"),
    "nvlink": XidClass(
        "nvlink_error", "root", "hardware", "self", "nvlink", 85,
        "an NVLink error on this GPU's links broke GPU-to-GPU traffic; collectives over it fail. It can "
        "also be the sympathetic side of a failure at the far end of the link."),
    "gpu_fault": XidClass(
        "xid", "root", "hardware", "self", "gpu_driver_xid_other", 80,
        "a driver/firmware-level fault of this GPU (GPU reset required); ranks on it fail and the others "
        "time out."),
    "mechanical": XidClass(
        "xid", "root", "hardware", "self", "gpu_hardware", 80,
        "the board reports a power or seating problem: check the GPU's power cables and seating."),
    "application": XidClass(
        "xid_app_fault", "confirmation", "workload", "none", "user_code_error", 75,
        "the GPU raised this because the application faulted (bad address, illegal instruction, invalid "
        "commands): a bug or misuse in the program, not a hardware fault unless it repeats on the same GPU "
        "with different programs.",
        "fix_and_resubmit"),
    "engine_fault": XidClass(
        "xid", "root", "hardware", "self", "gpu_driver_xid_other", 65,
        "a GPU engine raised an exception and the driver stopped the application using it; restart it and "
        "report the GPU if it repeats."),
    "unused": XidClass(
        "xid", "root", "hardware", "self", "gpu_driver_xid_other", 60,
        "a code that current drivers no longer use (deprecated, or V100 and older GPUs): a driver-reported "
        "GPU fault to review.",
        "human_review"),
    "driver_config": XidClass(
        "xid", "root", "software", "self", "gpu_driver_xid_other", 60,
        "the driver/firmware set-up of this GPU is wrong (vGPU, confidential computing, ECC/WPR "
        "configuration); fix the node's software configuration."),
    "sympathetic": XidClass(
        "xid_sympathetic", "cascade", "hardware", "self", "gpu_driver_xid_other", 40,
        "a secondary error expected alongside another fault; follow the other error, report it if it is "
        "seen alone.",
        "human_review"),
    "teardown": XidClass(
        "xid_app_teardown", "teardown", "software", "none", "unknown", 30,
        "the driver tore down the GPU channels of an application that was aborted (signal, Ctrl-C, GPU "
        "reset or an earlier error): a consequence, not a cause.",
        "human_review"),
    "informational": XidClass(
        "xid_info", "context", "hardware", "none", "healthy", 90,
        "informational: it summarizes the recovery action another Xid on this GPU requires.",
        "no_action"),
    "benign": XidClass(
        "xid_info", "context", "hardware", "none", "healthy", 90,
        "the catalog's immediate action is IGNORE: no recovery is needed and it does not fail a job by itself.",
        "no_action"),
}

# Catalog immediate bucket -> class (step 5). Workflow buckets are code-specific.
IMMEDIATE_CLASS: dict[str, str] = {
    "RESTART_BM": "gpu_lost",
    "RESET_GPU": "gpu_fault",
    "RESTART_APP": "engine_fault",  # refined by INVESTIGATORY_REFINES
    "CHECK_MECHANICALS": "mechanical",
    "UPDATE_SWFW": "driver_config",
    "RESTART_VM": "driver_config",
    "CONTACT_SUPPORT": "engine_fault",  # an engine error of unknown origin; rows described "Unused" become `unused`
    "IGNORE": "benign",
    "WORKFLOW_XID_48": "gpu_memory",
    "WORKFLOW_XID_45": "teardown",
    "WORKFLOW_NVLINK_ERR": "nvlink",
    "WORKFLOW_NVLINK5_ERR": "nvlink",
    "XID_154": "informational",
    "CHECK_UVM": "sympathetic",
}

# Catalog immediate bucket -> recommended action, for classes without a fixed action.
IMMEDIATE_ACTION: dict[str, str] = {
    "RESTART_BM": "drain_node",
    "RESET_GPU": "reset_gpu",
    "RESTART_APP": "restart",
    "CHECK_MECHANICALS": "drain_node",
    "UPDATE_SWFW": "human_review",
    "RESTART_VM": "restart",
    "CONTACT_SUPPORT": "human_review",
    "IGNORE": "no_action",
    "WORKFLOW_XID_48": "reset_gpu",  # "Solo: RESET_GPU; w/ 63 or 64: DRAIN_AND_RESET"
    "WORKFLOW_XID_45": "human_review",
    "WORKFLOW_NVLINK_ERR": "reset_gpu",  # Xid 74: "A GPU reset or node reboot is needed"
    "WORKFLOW_NVLINK5_ERR": "reset_gpu",  # fatal 144-150 decode to RESET_GPU
    "XID_154": "no_action",
    "CHECK_UVM": "human_review",
}

# Investigatory bucket refines an immediate RESTART_APP (step 3): the catalog sends the
# operator to the application for these, so they are application faults.
INVESTIGATORY_REFINES: dict[str, str] = {
    "CHECK_APP/CUDA": "application",
    "WORKFLOW_XID_13": "application",
    "WORKFLOW_XID_31": "application",
    "XID_137_FLOW": "application",
}

# Investigatory buckets that classify on their own (step 4), whatever the immediate bucket
# (except IGNORE, which stays benign).
INVESTIGATORY_CLASS: dict[str, str] = {
    "INVESTIGATE_LINK_SI": "nvlink",
    "INVESTIGATE_LINK_SI_AND_CABLES": "nvlink",
    "SYMPATHETIC_REPORT_SOLO": "sympathetic",
}

# Codes newer than the bucket columns (both buckets empty): read the mnemonic (step 2).
# (substring, class, action standing in for the missing immediate bucket); first match wins.
MNEMONIC_HINTS: tuple[tuple[str, str, str], ...] = (
    ("PSHC_", "benign", "no_action"),  # power-smoothing circuitry notices: "No GPU reset required"
    ("UNCORRECTABLE_DRAM", "gpu_memory_detail", "reset_gpu"),  # "Additional to Xid 48"
    ("UNCORRECTABLE_SRAM", "gpu_memory_detail", "reset_gpu"),
    ("PCIE_FATAL", "pcie_fatal", "drain_node"),
    ("NVLINK_SECURE", "driver_config", "human_review"),  # confidential-computing mode set-up only
    ("NVLINK_", "nvlink", "reset_gpu"),
    ("HALT", "gpu_fault", "reset_gpu"),  # micro-controller halt, like Xid 62 PMU_HALT_ERROR (RESET_GPU)
    ("REDUCED_GPU_MEMORY", "driver_config", "human_review"),  # WPR errors: "ECC should be enabled"
)

# Codes whose class the taxonomy or the catalog's own notes fix explicitly (step 1).
CODE_OVERRIDES: dict[str, tuple[str, str]] = {
    "32": ("gpu_fault", "catalog note: PBDMA faults are PCIe quality issues, not caused by the application"),
    "43": ("application", "catalog note: a user application hit a software-induced fault; the GPU stays healthy"),
    "45": ("teardown", "catalog note: logged whenever an application is aborted (Ctrl-C, SIGKILL, GPU reset)"),
    "48": ("gpu_memory", "DESIGN: uncorrectable ECC (double-bit) = gpu_hardware"),
    "63": ("remap_event", "DESIGN: row-remap event is benign context; the failure is Xid 64"),
    "64": ("remap_failure", "DESIGN: row-remap failure = gpu_hardware"),
    "74": ("nvlink", "DESIGN: Xid 74 = nvlink"),
    "79": ("gpu_lost", "DESIGN: fallen off the bus = gpu_hardware"),
    "94": ("gpu_memory", "DESIGN: contained memory error = gpu_hardware"),
    "95": ("gpu_memory", "DESIGN: uncontained memory error = gpu_hardware"),
    "137": ("application", "catalog XID_137_FLOW: illegal NVLink peer access, typically an application bug"),
    "140": ("gpu_memory", "DESIGN: unrecovered ECC error = gpu_hardware"),
    "154": ("informational", "catalog: informational only, always seen with another Xid"),
    "156": ("remap_event", "resource retirement event (investigatory IGNORE): the retirement waits for a reset, "
                           "like Xid 63; the uncorrectable error itself has its own Xid"),
}


@dataclass(frozen=True)
class CatalogRow:
    code: str
    mnemonic: str
    description: str
    immediate: str
    investigatory: str
    notes: str


def _clean(text: str) -> str:
    return " ".join((text or "").split())


def _bucket(text: str) -> str:
    """Buckets are single words except the odd multi-line cell; keep the text, one line."""
    return _clean(text)


def parse_catalog(text: str) -> list[CatalogRow]:
    """Rows of xids.csv (header names are matched with whitespace collapsed)."""
    reader = csv.reader(io.StringIO(text))
    header = [_clean(h) for h in next(reader)]
    col = {name: i for i, name in enumerate(header)}
    need = ("Code", "Mnemonic", "Description", "Resolution Bucket (Immediate Action)",
            "Resolution Bucket (Investigatory Action)", "Trigger Conditions")
    missing = [n for n in need if n not in col]
    if missing:
        raise ValueError(f"xids.csv lacks columns {missing}; header is {header}")
    rows = []
    for raw in reader:
        if not raw or not raw[col["Code"]].strip().isdigit():
            continue
        get = lambda name: raw[col[name]] if col[name] < len(raw) else ""  # noqa: E731
        rows.append(CatalogRow(
            code=str(int(get("Code"))), mnemonic=_clean(get("Mnemonic")), description=_clean(get("Description")),
            immediate=_bucket(get("Resolution Bucket (Immediate Action)")),
            investigatory=_bucket(get("Resolution Bucket (Investigatory Action)")),
            notes=_clean(get("Trigger Conditions")),
        ))
    return sorted(rows, key=lambda r: int(r.code))


def read_catalog(src_dir: Path | str) -> list[CatalogRow]:
    return parse_catalog((Path(src_dir) / "xids.csv").read_text(encoding="utf-8"))


def classify(row: CatalogRow) -> tuple[str, str]:
    """(class name, reason) for one catalog row; see the module docstring for the order."""
    if row.code in CODE_OVERRIDES:
        return CODE_OVERRIDES[row.code]
    if not row.immediate and not row.investigatory:
        for needle, cls, _action in MNEMONIC_HINTS:
            if needle in row.mnemonic:
                return cls, f"no bucket in the catalog; mnemonic {row.mnemonic} contains {needle}"
        return "unused", "no bucket in the catalog and no mnemonic hint"
    if row.immediate == "RESTART_APP" and row.investigatory in INVESTIGATORY_REFINES:
        return INVESTIGATORY_REFINES[row.investigatory], f"RESTART_APP with {row.investigatory}"
    if row.immediate != "IGNORE" and row.investigatory in INVESTIGATORY_CLASS:
        return INVESTIGATORY_CLASS[row.investigatory], f"investigatory bucket {row.investigatory}"
    if row.immediate == "CONTACT_SUPPORT" and row.description.lower() == "unused":
        return "unused", "CONTACT_SUPPORT, described Unused"
    cls = IMMEDIATE_CLASS.get(row.immediate, "unused")
    if cls == "gpu_fault" and "NVLINK" in row.mnemonic:
        return "nvlink", f"{row.immediate} on an NVLink mnemonic"
    return cls, f"immediate bucket {row.immediate or '(none)'}"


def table_row(row: CatalogRow) -> dict[str, str]:
    """The lookup row for one code: columns COLUMNS, keyed by the Xid number."""
    name, _reason = classify(row)
    cls = CLASSES[name]
    action = cls.action or IMMEDIATE_ACTION.get(row.immediate, "") or _hinted_action(row) or "human_review"
    what = row.description if row.description.lower() != "unused" else row.mnemonic
    return {
        "key": row.code,
        "symptom": cls.symptom,
        "role": cls.role,
        "domain": cls.domain,
        "implicates": cls.implicates,
        "outcome": cls.outcome,
        "summary": f"Xid {row.code} ({what}) on GPU {{gpu_pci}}: {cls.meaning}",
        "action": action,
        "priority": str(cls.priority),
        "title": f"Xid {row.code} {row.mnemonic}: {row.description}",
        "supersedes": SUPERSEDES.get(cls.symptom, "") if cls.role == "root" else "",
    }


def _hinted_action(row: CatalogRow) -> str:
    return next((a for needle, _c, a in MNEMONIC_HINTS if needle in row.mnemonic), "")


def build_table(rows: list[CatalogRow]) -> list[dict[str, str]]:
    return [table_row(r) for r in sorted(rows, key=lambda r: int(r.code))]


def render_csv(table: list[dict[str, str]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    return buf.getvalue()


def generate(src_dir: Path | str) -> str:
    """The text of packs/nvidia/xids.csv for the catalog in `src_dir`."""
    return render_csv(build_table(read_catalog(src_dir)))


def write_table(src_dir: Path | str, out_csv: Path | str) -> int:
    text = generate(src_dir)
    Path(out_csv).write_text(text, encoding="utf-8")
    return text.count("\n") - 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m faultline.rules.xid_catalog SRC_DIR OUT_CSV", file=sys.stderr)
        return 2
    n = write_table(args[0], args[1])
    print(f"wrote {n} Xid rows to {args[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
