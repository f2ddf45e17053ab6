"""What the operator chose for the service, and loading the two things it keeps for its lifetime:
the fleet config (optional) and the ruleset (once, at start-up)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from faultline import limits as L
from faultline.fleet.config import ConfigError, FleetConfig, load_config
from faultline.rules.loader import load_ruleset
from faultline.rules.model import Ruleset

DEFAULT_CONFIG = Path("data") / "faultline.yaml"
MIB = L.MIB
# Host header values accepted by default: the loopback names (a DNS-rebinding page's Host is its own name).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Settings:
    config: Path | None = None        # faultline.yaml (or its data dir); None: DEFAULT_CONFIG when present
    rules: tuple[str, ...] = ()       # extra rule pack folders (default: the fleet config's `rules:`)
    builtin: bool = True              # load the built-in packs too
    max_body_mb: float = L.MAX_BODY_MB  # largest request body (413 past it)
    workers_max: int = L.WORKERS_MAX  # diagnoses running at once
    queue_timeout_s: float = L.QUEUE_TIMEOUT_S  # longest wait for a free worker (503 past it)
    tmp_dir: Path | None = None       # where uploads are written while diagnosed
    max_files: int = L.MAX_FILES      # files of one upload
    max_json_mb: float = L.MAX_JSON_MB  # largest JSON body (it is decoded in memory; 413 past it)
    body_slots: int | None = None     # JSON bodies over 1 MiB read at once (default workers_max + 2); 503 past it
    max_decompressed_mb: float = L.SERVICE_DECOMPRESSED_MB  # text one request's files may yield, decompressed
    max_lines: int = L.SERVICE_MAX_LINES  # lines one request's files may yield (past either: cut, in the coverage)
    allowed_hosts: tuple[str, ...] = ()    # Host header names accepted besides loopback ("*": any)
    allowed_origins: tuple[str, ...] = ()  # browser origins (scheme://host[:port]) allowed to POST
    header_timeout_s: float = L.HEADER_TIMEOUT_S  # a connection must send a complete request head within this
    read_timeout_s: float = L.READ_TIMEOUT_S  # longest pause between two pieces of a request body (408 past it)
    body_timeout_s: float = L.BODY_TIMEOUT_S  # longest time to receive a whole request body (408 past it)
    keep_alive_s: int = L.KEEP_ALIVE_S  # an idle kept-alive connection is closed after this
    max_connections: int = L.MAX_CONNECTIONS  # open connections and requests at once (503 past it)
    tokens_file: Path | None = None   # bearer tokens (hashes, scopes, limits); None: $FAULTLINE_TOKENS, else open
    sessions_db: Path | None = None   # the sessions' DuckDB file (default <data dir>/service/sessions.duckdb)
    session_ttl_s: float = 24 * 3600  # a session expires this long after its last change
    max_sessions: int = 1000          # sessions kept at once (429 past it)
    max_session_lines: int = L.SESSION_LINES
    max_session_mb: float = L.SESSION_MB  # log text one session may hold
    max_session_batches: int = 10_000
    drains_per_cluster_hour: int = 4  # action guard: node actions approved per cluster in any hour
    drains_per_job: int = 2           # action guard: nodes of one job
    drain_max_fraction: float = 0.25  # action guard: never more than this share of a job's nodes
    webhook_url: str | None = None    # receives every final verdict (JSON, HMAC-signed)
    webhook_secret_env: str = "FAULTLINE_WEBHOOK_SECRET"  # the environment variable holding the HMAC key
    webhook_retries: int = 5          # attempts after the first, with exponential backoff
    webhook_backoff_s: float = 1.0    # first wait between attempts (doubling, at most 60 s)

    def __post_init__(self):
        if self.max_body_mb <= 0:
            raise ValueError("--max-body-mb must be positive")
        if self.workers_max < 1:
            raise ValueError("--workers-max must be at least 1")
        if self.queue_timeout_s < 0:
            raise ValueError("--queue-timeout must not be negative")
        if self.max_json_mb <= 0:
            raise ValueError("--max-json-mb must be positive")
        for name in ("header_timeout_s", "read_timeout_s", "body_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name[:-2].replace('_', '-')} must be positive")
        if self.max_connections < 1:
            raise ValueError("--max-connections must be at least 1")
        if self.max_decompressed_mb <= 0 or self.max_lines < 1:
            raise ValueError("--max-decompressed-mb and --max-lines must be positive")

    @property
    def read_limits(self) -> L.ReadLimits:
        """What one request's files may yield; past it the text is cut and the coverage says where."""
        text = int(self.max_decompressed_mb * MIB)
        return L.ReadLimits(file_bytes=min(text, L.CLI_READ.file_bytes), job_bytes=text, job_lines=self.max_lines)

    @property
    def max_json_bytes(self) -> int:
        return min(int(self.max_json_mb * MIB), self.max_body_bytes)

    @property
    def json_slots(self) -> int:
        return self.body_slots if self.body_slots is not None else self.workers_max + L.BODY_SLOTS_EXTRA

    def host_allowed(self, host: str) -> bool:
        """A Host header value (with or without port) is one the service answers to."""
        if "*" in self.allowed_hosts:
            return True
        name = host_name(host)
        return name in LOOPBACK_HOSTS or name in {h.lower() for h in self.allowed_hosts}

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * MIB)

    @classmethod
    def from_args(cls, args) -> Settings:
        hosts = tuple(args.allowed_host or ())
        if args.host not in ("0.0.0.0", "::", "") and args.host not in hosts:  # the address it listens on
            hosts += (args.host,)
        return cls(config=Path(args.config) if args.config else None, rules=tuple(args.rules or ()),
                   sessions_db=Path(args.sessions_db) if args.sessions_db else None,
                   tokens_file=Path(args.tokens) if args.tokens else None,
                   drains_per_cluster_hour=args.drains_per_cluster_hour, drains_per_job=args.drains_per_job,
                   drain_max_fraction=args.drain_max_fraction, webhook_url=args.webhook_url,
                   session_ttl_s=args.session_ttl_hours * 3600, max_sessions=args.max_sessions,
                   max_session_lines=args.max_session_lines, max_session_mb=args.max_session_mb,
                   builtin=not args.no_builtin, max_body_mb=args.max_body_mb, workers_max=args.workers_max,
                   queue_timeout_s=args.queue_timeout, tmp_dir=Path(args.tmp_dir) if args.tmp_dir else None,
                   max_json_mb=args.max_json_mb, allowed_hosts=hosts, allowed_origins=tuple(args.allowed_origin or ()),
                   header_timeout_s=args.header_timeout, read_timeout_s=args.read_timeout,
                   body_timeout_s=args.body_timeout, keep_alive_s=args.keep_alive,
                   max_connections=args.max_connections, max_decompressed_mb=args.max_decompressed_mb,
                   max_lines=args.max_lines)


def host_name(host: str) -> str:
    """`Host` header -> the bare lower-case name: `[::1]:8080` -> `::1`, `Example:80` -> `example`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        return host.split(":")[0]
    return host


def config_location(config: Path | None) -> tuple[Path, Path, bool]:
    """(data dir, config file, required): a folder means its faultline.yaml; a file's folder is the data dir."""
    if config is None:
        return DEFAULT_CONFIG.parent, DEFAULT_CONFIG, False
    config = Path(config)
    if config.is_dir():
        return config, config / "faultline.yaml", True
    return config.parent, config, True


def load_fleet(settings: Settings) -> tuple[Path, FleetConfig | None]:
    """The data dir and the fleet config; None when no config was asked for and the default is absent.
    A config that was asked for but is missing or invalid is an error (the service does not start)."""
    data_dir, path, required = config_location(settings.config)
    if not required and not path.is_file():
        return data_dir, None
    try:
        cfg = load_config(data_dir, path)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    return cfg.data_dir, cfg


def load_service_ruleset(settings: Settings, fleet: FleetConfig | None) -> Ruleset:
    """The packs `faultline` loads elsewhere: --rules when given, else the fleet config's `rules:`
    (as the flows do), plus the built-in packs unless --no-builtin."""
    extra = settings.rules or (fleet.extra_rules if fleet is not None else ())
    return load_ruleset([Path(p) for p in extra], builtin=settings.builtin)
