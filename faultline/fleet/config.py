"""Fleet configuration: which clusters, and where their scheduler, logs and metrics come from.

```yaml
# <data dir>/faultline.yaml
margin_minutes: 15            # logs are pulled from this long before a job's start
clusters:
  - name: alpha
    scheduler: {kind: sacct_files, path: /sim}     # or {kind: sacct} to run sacct on this host
    logs: {kind: loki_files, path: /sim}           # saved Loki query_range responses, one per line
    metrics: {kind: parquet_files, path: /sim}     # optional
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

SCHEDULER_KINDS = ("sacct_files", "sacct")
LOG_KINDS = ("loki_files",)
METRIC_KINDS = ("parquet_files",)


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    scheduler: dict
    logs: dict | None = None
    metrics: dict | None = None


@dataclass(frozen=True)
class FleetConfig:
    data_dir: Path
    clusters: tuple[ClusterConfig, ...] = ()
    margin_minutes: int = 15
    max_drain: int = 2
    extra_rules: tuple[str, ...] = field(default_factory=tuple)

    @property
    def warehouse_dir(self) -> Path:
        return self.data_dir / "warehouse"

    @property
    def reports_dir(self) -> Path:
        return self.data_dir / "reports"


def _check(kind_of: str, section: dict | None, kinds: tuple[str, ...], where: str, required: bool) -> None:
    if section is None:
        if required:
            raise ConfigError(f"{where}: '{kind_of}' is required")
        return
    if not isinstance(section, dict) or section.get("kind") not in kinds:
        raise ConfigError(f"{where}: {kind_of}.kind must be one of {kinds}")


def load_config(data_dir: Path, path: Path | None = None) -> FleetConfig:
    """The fleet config of `data_dir`: `<data_dir>/faultline.yaml`, or the file `path` when given."""
    data_dir = Path(data_dir)
    path = Path(path) if path is not None else data_dir / "faultline.yaml"
    if not path.is_file():
        raise ConfigError(f"{path} not found: run `faultline simulate` + `faultline demo`, or write one (see docs/fleet.md)")
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    clusters = []
    for i, c in enumerate(raw.get("clusters") or []):
        where = f"{path}: clusters[{i}]"
        if not isinstance(c, dict) or not c.get("name"):
            raise ConfigError(f"{where}: needs a name")
        _check("scheduler", c.get("scheduler"), SCHEDULER_KINDS, where, True)
        _check("logs", c.get("logs"), LOG_KINDS, where, False)
        _check("metrics", c.get("metrics"), METRIC_KINDS, where, False)
        clusters.append(ClusterConfig(c["name"], c["scheduler"], c.get("logs"), c.get("metrics")))
    if not clusters:
        raise ConfigError(f"{path}: no clusters configured")
    return FleetConfig(data_dir=data_dir, clusters=tuple(clusters), margin_minutes=int(raw.get("margin_minutes", 15)),
                       max_drain=int(raw.get("max_drain", 2)), extra_rules=tuple(raw.get("rules") or ()))


def write_config(data_dir: Path, clusters: list[dict], **extra) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "faultline.yaml"
    path.write_text(yaml.safe_dump({**extra, "clusters": clusters}, sort_keys=False), encoding="utf-8")
    return path
