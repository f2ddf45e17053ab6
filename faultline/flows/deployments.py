"""The deployments of prefect.yaml as Python objects, for `faultline flows serve` and the tests.

prefect.yaml stays the single source: this reads it and builds the same deployments
(entrypoint, parameters, schedules, triggers) with Prefect's own models.
"""

from __future__ import annotations

from pathlib import Path

import yaml

PROJECT_DIR = Path(__file__).resolve().parents[2]
PREFECT_YAML = PROJECT_DIR / "prefect.yaml"


def read_deployments(path: Path = PREFECT_YAML) -> list[dict]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return doc["deployments"]


def load_entrypoint(entrypoint: str):
    from prefect.flows import load_flow_from_entrypoint

    file, _, name = entrypoint.partition(":")
    return load_flow_from_entrypoint(f"{PROJECT_DIR / file}:{name}")


def build(spec: dict, parameters: dict | None = None):
    """One prefect.yaml deployment -> a RunnerDeployment (validates schedules and triggers)."""
    from prefect.client.schemas.schedules import construct_schedule
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger

    flow = load_entrypoint(spec["entrypoint"])
    schedules = []
    for s in spec.get("schedules") or []:
        s = dict(s)
        if "interval" in s:
            schedules.append(construct_schedule(interval=s["interval"], anchor_date=s.get("anchor_date")))
        else:
            schedules.append(construct_schedule(cron=s["cron"], timezone=s.get("timezone")))
    triggers = [DeploymentEventTrigger(**{k: v for k, v in t.items() if k != "type"})
                for t in spec.get("triggers") or []]
    return flow.to_deployment(name=spec["name"], description=spec.get("description"),
                              parameters={**(spec.get("parameters") or {}), **(parameters or {})},
                              schedules=schedules or None, triggers=triggers or None)


def build_all(parameters: dict | None = None, path: Path = PREFECT_YAML) -> list:
    return [build(spec, parameters) for spec in read_deployments(path)]
