"""What the operator chose for the service, and loading the two things it keeps for its lifetime:
the fleet config (optional) and the ruleset (once, at start-up)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from faultline.fleet.config import ConfigError, FleetConfig, load_config
from faultline.rules.loader import load_ruleset
from faultline.rules.model import Ruleset

DEFAULT_CONFIG = Path("data") / "faultline.yaml"
MIB = 1 << 20


@dataclass(frozen=True)
class Settings:
    config: Path | None = None        # faultline.yaml (or its data dir); None: DEFAULT_CONFIG when present
    rules: tuple[str, ...] = ()       # extra rule pack folders (default: the fleet config's `rules:`)
    builtin: bool = True              # load the built-in packs too
    max_body_mb: float = 512          # largest request body (413 past it)
    workers_max: int = 2              # diagnoses running at once
    queue_timeout_s: float = 30.0     # longest wait for a free worker (503 past it)
    tmp_dir: Path | None = None       # where uploads are written while diagnosed
    max_files: int = 20_000           # files of one upload

    def __post_init__(self):
        if self.max_body_mb <= 0:
            raise ValueError("--max-body-mb must be positive")
        if self.workers_max < 1:
            raise ValueError("--workers-max must be at least 1")
        if self.queue_timeout_s < 0:
            raise ValueError("--queue-timeout must not be negative")

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * MIB)

    @classmethod
    def from_args(cls, args) -> Settings:
        return cls(config=Path(args.config) if args.config else None, rules=tuple(args.rules or ()),
                   builtin=not args.no_builtin, max_body_mb=args.max_body_mb, workers_max=args.workers_max,
                   queue_timeout_s=args.queue_timeout, tmp_dir=Path(args.tmp_dir) if args.tmp_dir else None)


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
