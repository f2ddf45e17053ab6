"""Fleet configuration: which clusters, and where their scheduler, logs and metrics come from.

```yaml
# <data dir>/faultline.yaml
margin_minutes: 15            # logs are pulled from this long before a job's start
scheduler_lag_minutes: 15     # collect re-reads this long before its cursor: jobs reach sacct/the API late
initial_lookback_minutes: 60  # a cluster's first collect (no cursor yet) reads this far back; older: backfill
logs_retry_minutes: 60        # a job whose logs failed is held back (not committed) and retried by later
                              # collects until this long after its end; then committed with the error
diagnose_horizon_days: 30     # diagnose looks for undiagnosed jobs in batches committed this recently
diagnose_batch_jobs: 500      # a partition's jobs are diagnosed this many at a time: memory holds one batch's lines
clusters:
  - name: alpha
    scheduler: {kind: sacct_files, path: /sim}     # or {kind: sacct} to run sacct on this host
    logs: {kind: loki_files, path: /sim}           # saved Loki query_range responses, one per line
    metrics: {kind: parquet_files, path: /sim}     # optional: <path>/<cluster>/metrics/<day>.parquet samples
    node_events: {kind: jsonl_files, path: /sim}   # optional: <path>/<cluster>/node_events/<day>.jsonl
  - name: charlie
    scheduler:                                     # Slurm's REST API with a JWT (docs/fleet.md "Slurm")
      kind: slurmrestd
      url: http://slurmrestd.example.internal:6820
      token_env: SLURM_JWT                         # the NAME of the variable holding `scontrol token` output
      user_name: faultline                         # X-SLURM-USER-NAME
      api_version: v0.0.38                         # Slurm 22.05
    metrics:                                       # a live Prometheus, asked job by job (docs/fleet.md)
      kind: prometheus
      url: http://prometheus.example.internal:9090
      node_label: instance                         # label naming the node (host or host:port)
      # queries: [DCGM_FI_DEV_XID_ERRORS, 'up{job="node"}', {name: x, query: 'max by (instance) (x{$node_matcher})'}]
      step_s: 30                                   # query_range resolution
      max_points: 11000                            # per series and request (Prometheus's own limit)
  - name: bravo
    scheduler: {kind: sacct, timeout_s: 20}       # sacct's time limit (default $FAULTLINE_SACCT_TIMEOUT_S, else 20 s / 120 s)
    logs:                                          # a live Loki, asked job by job (docs/fleet.md "Live Loki")
      kind: loki
      url: https://loki.example.internal:3100      # required, http(s)
      query: '{cluster="{cluster}", job_id="{job_id}"}'   # default; or a list of templates. Fields: cluster,
                                                   # job_id, attempt, name, user, queue (escaped as LogQL string
                                                   # content), nodes_regex (the job's nodes, an RE2 alternation)
      headers: {X-Scope-OrgID: gpu-fleet}          # optional, e.g. the tenant of a multi-tenant Loki
      bearer_token_env: LOKI_TOKEN                 # optional: secrets only by environment variable name;
      # username: 12345 / username_env + password_env: basic auth instead
      # ca_file: /etc/ssl/internal-ca.pem          # optional CA bundle for https
      # node_label: hostname, source_label: stream # optional: which labels name the node / the source
      timeout_s: 30                                # per request
      retries: 3                                   # for 429, 5xx, timeouts, refused connections (Retry-After honoured)
      backoff_s: 0.5                               # first retry wait, doubling
      page_limit: 5000                             # lines per request; at most Loki's max_entries_limit_per_query
      max_lines_per_job: 2000000                   # past it: first and last half kept, coverage says so
      max_parallel: 4                              # jobs in flight against this Loki
      tail_minutes: 5                              # lines read until this long after a job's end
  - name: kube-east                                # a Kubernetes cluster with Kueue (docs/fleet.md "Kubernetes")
    kind: kubernetes
    kubernetes: {kubeconfig: /etc/faultline/kubeconfig, context: gpu-east}   # or {in_cluster: true}
    scheduler: {kind: kueue, namespaces: [team-a]} # Workloads are the jobs
    logs: {kind: kubernetes, previous: true, events: true, limit_bytes: 16777216}
```

Every problem of the file is reported at once (one ConfigError, one line per problem with its place).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from faultline.collectors.kubernetes import KubeSettings, PodLogSettings
from faultline.collectors.kueue import KueueSettings
from faultline.collectors.loki import LokiSettings
from faultline.collectors.prometheus import PrometheusSettings
from faultline.collectors.slurm import sacct_timeout
from faultline.collectors.slurmrestd import SlurmRestSettings

SCHEDULER_KINDS = ("sacct_files", "sacct", "slurmrestd", "kueue")
LOG_KINDS = ("loki_files", "loki", "kubernetes")
CLUSTER_KINDS = ("slurm", "kubernetes")
# What each cluster kind can take (a Kueue scheduler needs the Kubernetes API of its cluster).
KIND_SCHEDULERS = {"slurm": ("sacct_files", "sacct", "slurmrestd"), "kubernetes": ("kueue",)}
KIND_LOGS = {"slurm": ("loki_files", "loki"), "kubernetes": ("kubernetes",)}
SETTINGS = {"loki": LokiSettings, "slurmrestd": SlurmRestSettings, "prometheus": PrometheusSettings,
            "kueue": KueueSettings, "kubernetes": PodLogSettings}
METRIC_KINDS = ("parquet_files", "prometheus")
NODE_EVENT_KINDS = ("jsonl_files",)


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    scheduler: dict
    logs: dict | None = None
    metrics: dict | None = None
    node_events: dict | None = None
    kind: str = "slurm"               # or kubernetes (scheduler kueue, logs from the pods)
    kubernetes: dict | None = None    # kind kubernetes: how to reach the API server (KubeSettings)


@dataclass(frozen=True)
class FleetConfig:
    data_dir: Path
    clusters: tuple[ClusterConfig, ...] = ()
    margin_minutes: int = 15
    scheduler_lag_minutes: float = 15
    initial_lookback_minutes: float = 60
    logs_retry_minutes: float = 60
    diagnose_horizon_days: float = 30
    max_drain: int = 2
    diagnose_batch_jobs: int = 500
    extra_rules: tuple[str, ...] = field(default_factory=tuple)

    @property
    def warehouse_dir(self) -> Path:
        return self.data_dir / "warehouse"

    @property
    def reports_dir(self) -> Path:
        return self.data_dir / "reports"


def _check(kind_of: str, section, kinds: tuple[str, ...], where: str, required: bool) -> list[str]:
    """Every problem of one source section (empty: fine)."""
    if section is None:
        return [f"{where}: '{kind_of}' is required"] if required else []
    if not isinstance(section, dict) or section.get("kind") not in kinds:
        return [f"{where}: {kind_of}.kind must be one of {kinds}"]
    settings = SETTINGS.get(section["kind"])
    if settings is not None:
        try:
            settings.from_config(section)
        except ValueError as exc:
            return [f"{where}: {kind_of} (kind {section['kind']}): {exc}"]
    elif section["kind"] == "sacct":
        try:
            sacct_timeout(section, 1.0)
        except ValueError as exc:
            return [f"{where}: {kind_of} (kind sacct): {exc}"]
    elif section["kind"].endswith("_files") and not section.get("path"):
        return [f"{where}: {kind_of}.path is required for kind {section['kind']}"]
    return []


def _check_cluster(c: dict, where: str) -> list[str]:
    kind = c.get("kind", "slurm")
    if kind not in CLUSTER_KINDS:
        return [f"{where}: kind must be one of {CLUSTER_KINDS}, got {kind!r}"]
    errors = _check("scheduler", c.get("scheduler"), KIND_SCHEDULERS[kind], where, True)
    errors += _check("logs", c.get("logs"), KIND_LOGS[kind], where, False)
    errors += _check("metrics", c.get("metrics"), METRIC_KINDS, where, False)
    errors += _check("node_events", c.get("node_events"), NODE_EVENT_KINDS, where, False)
    if kind == "kubernetes":
        try:
            KubeSettings.from_config(c.get("kubernetes"))
        except ValueError as exc:
            errors.append(f"{where}: kubernetes: {exc}")
    elif c.get("kubernetes") is not None:
        errors.append(f"{where}: 'kubernetes' is for clusters of kind kubernetes")
    unknown = sorted(set(c) - {"name", "kind", "scheduler", "logs", "metrics", "node_events", "kubernetes"})
    if unknown:
        errors.append(f"{where}: unknown key(s) {unknown}")
    return errors


def load_config(data_dir: Path, path: Path | None = None) -> FleetConfig:
    """The fleet config of `data_dir`: `<data_dir>/faultline.yaml`, or the file `path` when given. Every
    problem of the file is reported at once (one ConfigError, one line per problem, each with its place)."""
    data_dir = Path(data_dir)
    path = Path(path) if path is not None else data_dir / "faultline.yaml"
    if not path.is_file():
        raise ConfigError(f"{path} not found: run `faultline simulate` + `faultline demo`, or write one (see docs/fleet.md)")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the file must be a mapping with a 'clusters' list")
    errors: list[str] = []
    clusters = []
    names = set()
    for i, c in enumerate(raw.get("clusters") or []):
        if not isinstance(c, dict) or not c.get("name"):
            errors.append(f"{path}: clusters[{i}]: needs a name")
            continue
        where = f"{path}: cluster {c['name']!r}"
        if c["name"] in names:
            errors.append(f"{where}: a second cluster of that name")
        names.add(c["name"])
        problems = _check_cluster(c, where)
        errors += problems
        if not problems:
            clusters.append(ClusterConfig(c["name"], c["scheduler"], c.get("logs"), c.get("metrics"),
                                          c.get("node_events"), c.get("kind", "slurm"), c.get("kubernetes")))
    if not clusters and not errors:
        errors.append(f"{path}: no clusters configured")
    numbers = {}
    for key in ("scheduler_lag_minutes", "initial_lookback_minutes", "logs_retry_minutes", "diagnose_horizon_days"):
        if key in raw:
            try:
                numbers[key] = float(raw[key])
            except (TypeError, ValueError):
                errors.append(f"{path}: {key} must be a number, not {raw[key]!r}")
                continue
            if numbers[key] < 0:
                errors.append(f"{path}: {key} must be >= 0")
    if errors:
        raise ConfigError("\n".join(errors))
    return FleetConfig(data_dir=data_dir, clusters=tuple(clusters), margin_minutes=int(raw.get("margin_minutes", 15)),
                       max_drain=int(raw.get("max_drain", 2)),
                       diagnose_batch_jobs=max(1, int(raw.get("diagnose_batch_jobs", 500))), extra_rules=tuple(raw.get("rules") or ()), **numbers)


def write_config(data_dir: Path, clusters: list[dict], **extra) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "faultline.yaml"
    path.write_text(yaml.safe_dump({**extra, "clusters": clusters}, sort_keys=False), encoding="utf-8")
    return path
