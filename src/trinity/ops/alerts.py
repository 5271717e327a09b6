"""Scheduled runs that go wrong notify someone: Prefect Automations per deployment named in prefect.yaml's
`trinity.notify` section, created (or replaced) by `flows/deploy.py` right after the deployments are registered.

    trinity:
      notify:
        on_failed: [nightly-eval]    # deployments whose runs notify when they end Failed, Crashed or TimedOut
        on_missed: [nightly-eval]    # deployments that notify when no run of theirs finished in time
        missed_after_minutes: null   # that time; null: the schedule's longest gap + timeout_minutes + 1 h
        block: slack-webhook/ops     # an existing Prefect notification block, "<block type slug>/<block name>"
        webhook_url: null            # or a URL: deploy saves a custom-webhook block that POSTs JSON there

Prefect names a flow run's event after its state: a run that ends Failed emits `prefect.flow-run.Failed`, one whose
process died `prefect.flow-run.Crashed`, one that ran past its timeout `prefect.flow-run.TimedOut` (a state of type
FAILED named TimedOut). So the failure automation of a deployment (`failure_automation`, "trinity: <name> failed")
is a reactive trigger on all three (`FAILURE_EVENTS`) for a flow run of that deployment; its action sends the block
a subject naming the deployment, the run and how it ended, and a body with the run's state message (for
nightly-eval: the drop that failed it) and its id.

A night that never ran emits nothing, so the second automation ("trinity: <name> missed", `missed_automation`) is
proactive: after a run of the deployment finished (`FINISHED_EVENTS`: Completed, Failed, Crashed or TimedOut), it
expects another within `missed_after` (the same events start and satisfy it, so every finished run restarts the
wait), and fires when none came — the worker was down, the schedule paused, the night Cancelled because the
checkout was busy, the server restarted past the run's time. Deploy arms it at once, so a first night that never
runs notifies too; while nothing runs it notifies again every `missed_after`. The default window is the schedule's
longest gap between two runs (24 h for `0 2 * * *`), plus the run's `timeout_minutes` parameter when it has one,
plus `MISSED_GRACE` — a night that runs late but finishes does not notify. Its message can name no flow run (there
is none): it names the deployment, the window and where to look.

Prefect's server evaluates triggers and runs actions itself, so nothing else needs to be running. `prefect
automation ls` lists them. With neither `block` nor `webhook_url`, no automation is created and deploy says so: a
failed or missing run then notifies nobody.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

AUTOMATION_PREFIX = "trinity: "
WEBHOOK_BLOCK_NAME = "trinity-failed-runs"
"""The custom-webhook notification block deploy saves for `webhook_url`."""

FAILURE_EVENTS = ("prefect.flow-run.Failed", "prefect.flow-run.Crashed", "prefect.flow-run.TimedOut")
"""A run that ended without doing its job: the events Prefect emits for the states Failed, Crashed, TimedOut."""
FINISHED_EVENTS = ("prefect.flow-run.Completed",) + FAILURE_EVENTS
"""A run that ran to an end (Cancelled is not one: a night refused because the checkout was busy did not run)."""
MISSED_GRACE = timedelta(hours=1)

SUBJECT = "Trinity: {{ deployment.name }} run {{ flow_run.name }} ended {{ flow_run.state.name }}"
BODY = ("{{ deployment.name }} run {{ flow_run.name }} ({{ flow_run.id }}) ended {{ flow_run.state.name }}: "
        "{{ flow_run.state.message }}")


class NotifyConfigError(ValueError):
    """prefect.yaml's trinity.notify section is malformed; the message names the key."""


@dataclass(frozen=True)
class NotifySettings:
    on_failed: list[str] = field(default_factory=list)
    block: str | None = None
    webhook_url: str | None = None
    on_missed: list[str] = field(default_factory=list)
    missed_after_minutes: float | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.on_failed or self.on_missed) and bool(self.block or self.webhook_url)


KEYS = ("on_failed", "on_missed", "missed_after_minutes", "block", "webhook_url")


def _names(where: str, key: str, value: Any) -> list[str]:
    value = value or []
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise NotifyConfigError(f"{where}: trinity.notify.{key} must be a list of deployment names, got {value!r}")
    return list(value)


def notify_settings(doc: dict, where: str) -> NotifySettings:
    """Read `trinity.notify` of a prefect.yaml document (`where`: the file, for messages)."""
    section = ((doc or {}).get("trinity") or {}).get("notify")
    if section is None:
        return NotifySettings()
    if not isinstance(section, dict):
        raise NotifyConfigError(f"{where}: trinity.notify must be a mapping ({', '.join(KEYS)})")
    unknown = set(section) - set(KEYS)
    if unknown:
        raise NotifyConfigError(f"{where}: trinity.notify: unknown key(s) {sorted(unknown)} (expected "
                                f"{', '.join(KEYS)})")
    on_failed = _names(where, "on_failed", section.get("on_failed"))
    on_missed = _names(where, "on_missed", section.get("on_missed"))
    minutes = section.get("missed_after_minutes")
    if minutes is not None and (isinstance(minutes, bool) or not isinstance(minutes, (int, float))
                                or not minutes * 60 >= 10):
        raise NotifyConfigError(f"{where}: trinity.notify.missed_after_minutes must be a number of minutes (at least "
                                f"1/6: Prefect's shortest proactive window is 10 s), or null for the schedule's "
                                f"longest gap + timeout_minutes + 1 h; got {minutes!r}")
    block, url = section.get("block"), section.get("webhook_url")
    if block is not None and (not isinstance(block, str) or block.count("/") != 1 or not all(block.split("/"))):
        raise NotifyConfigError(f"{where}: trinity.notify.block must be '<block type slug>/<block name>' (e.g. "
                                f"slack-webhook/ops), got {block!r}")
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        raise NotifyConfigError(f"{where}: trinity.notify.webhook_url must be an http(s) URL, got {url!r}")
    if block and url:
        raise NotifyConfigError(f"{where}: trinity.notify: give block or webhook_url, not both")
    return NotifySettings(on_failed=on_failed, block=block, webhook_url=url, on_missed=on_missed,
                          missed_after_minutes=None if minutes is None else float(minutes))


def schedule_gap(schedules: list[dict] | None, where: str) -> timedelta:
    """The longest time between two consecutive runs of a deployment's schedules (prefect.yaml's `schedules:`
    list: cron or interval), over their next 200 runs; NotifyConfigError when it has none that can be read."""
    import asyncio
    from datetime import datetime, timezone

    from prefect.server.schemas.schedules import CronSchedule

    times: list = []
    now = datetime.now(timezone.utc)
    for i, sched in enumerate(schedules or []):
        if not isinstance(sched, dict) or sched.get("active") is False:
            continue
        if "cron" in sched:
            cron = CronSchedule(cron=sched["cron"], timezone=sched.get("timezone") or "UTC")
            times += asyncio.run(cron.get_dates(n=200, start=now))
        elif "interval" in sched:
            step = timedelta(seconds=float(sched["interval"]))
            times += [now + k * step for k in range(200)]
        else:
            raise NotifyConfigError(f"{where}.schedules[{i}]: only cron and interval schedules have a gap deploy can "
                                    "compute; set trinity.notify.missed_after_minutes")
    times = sorted(set(times))
    if len(times) < 2:
        raise NotifyConfigError(f"{where}: no active schedule, so no run is expected: take it out of "
                                "trinity.notify.on_missed")
    return timedelta(seconds=max((b - a).total_seconds() for a, b in zip(times, times[1:])))


def missed_window(settings: NotifySettings, deployment: dict, where: str) -> tuple[timedelta, str]:
    """How long after a finished run the next must have finished, and how that was worked out (for messages)."""
    if settings.missed_after_minutes is not None:
        return timedelta(minutes=settings.missed_after_minutes), "trinity.notify.missed_after_minutes"
    gap = schedule_gap(deployment.get("schedules"), where)
    timeout = (deployment.get("parameters") or {}).get("timeout_minutes")
    run = timedelta(minutes=float(timeout)) if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) \
        else timedelta(0)
    why = f"the schedule's longest gap {_human(gap)}" + (f" + timeout_minutes {_human(run)}" if run else "") + \
        f" + {_human(MISSED_GRACE)} grace"
    return gap + run + MISSED_GRACE, why


def _human(d: timedelta) -> str:
    s = int(d.total_seconds())
    if s % 3600 == 0:
        return f"{s // 3600} h"
    if s % 60 == 0:
        return f"{s // 60} min"
    return f"{s} s"


def notification_block_id(client, settings: NotifySettings) -> UUID:
    """The notification block the automations send to: the named one (it must exist), or the webhook block saved
    (or updated) for `webhook_url`."""
    from prefect.exceptions import ObjectNotFound

    if settings.block:
        slug, name = settings.block.split("/")
        try:
            return client.read_block_document_by_name(name, block_type_slug=slug).id
        except ObjectNotFound:
            raise NotifyConfigError(f"trinity.notify.block: no block {settings.block!r} on the Prefect API (create it "
                                    "in the UI or with `prefect block create`)") from None
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    block = CustomWebhookNotificationBlock(name=WEBHOOK_BLOCK_NAME, url=settings.webhook_url, method="POST",
                                           json_data={"subject": "{{subject}}", "body": "{{body}}"})
    return block.save(WEBHOOK_BLOCK_NAME, overwrite=True)  # (through the API the environment names)


def _of_deployment(deployment_id: UUID) -> dict:
    return {"match": {"prefect.resource.id": "prefect.flow-run.*"},
            "match_related": {"prefect.resource.role": "deployment",
                              "prefect.resource.id": f"prefect.deployment.{deployment_id}"}}


def failure_automation(deployment_id: UUID, deployment_name: str, block_id: UUID) -> Any:
    """The automation: each flow run of the deployment that ends Failed, Crashed or TimedOut sends the block
    SUBJECT and BODY."""
    from prefect.automations import AutomationCore, EventTrigger, Posture, SendNotification

    return AutomationCore(
        name=f"{AUTOMATION_PREFIX}{deployment_name} failed",
        description=f"Created by flows/deploy.py: notify when a run of deployment {deployment_name} ends Failed, "
                    "Crashed or TimedOut",
        trigger=EventTrigger(**_of_deployment(deployment_id), expect=set(FAILURE_EVENTS), posture=Posture.Reactive,
                             threshold=1, within=timedelta(0)),
        actions=[SendNotification(block_document_id=block_id, subject=SUBJECT, body=BODY)])


def missed_automation(deployment_id: UUID, deployment_name: str, block_id: UUID, within: timedelta,
                      why: str) -> Any:
    """The automation: no run of the deployment finished within `within` of the previous one (or of deploy)."""
    from prefect.automations import AutomationCore, EventTrigger, Posture, SendNotification

    finished = ", ".join(e.rsplit(".", 1)[1] for e in FINISHED_EVENTS)
    return AutomationCore(
        name=f"{AUTOMATION_PREFIX}{deployment_name} missed",
        description=f"Created by flows/deploy.py: notify when no run of deployment {deployment_name} finished "
                    f"within {_human(within)} ({why})",
        trigger=EventTrigger(**_of_deployment(deployment_id), after=set(FINISHED_EVENTS), expect=set(FINISHED_EVENTS),
                             posture=Posture.Proactive, threshold=1, within=within),
        actions=[SendNotification(
            block_document_id=block_id,
            subject=f"Trinity: {deployment_name} did not run: no run finished within {_human(within)}",
            body=f"No run of deployment {deployment_name} ended {finished} within {_human(within)} ({why}) of the "
                 "previous one (or of deploy): a scheduled run did not run, or has not finished. Check the worker "
                 "(`prefect worker start --pool <its pool> --type process`), that the deployment and its schedule are "
                 "not paused, and its latest runs (`prefect flow-run ls`): a Late or Cancelled run says why.")])


def ensure_automations(client, settings: NotifySettings, deployments: dict[str, UUID],
                       declared: dict[str, dict] | None = None, where: str = "prefect.yaml") -> list[str]:
    """Replace the failure automation of each deployment in `settings.on_failed` and the missed-run automation of
    each in `settings.on_missed` (`deployments`: registered name → id; `declared`: name → its prefect.yaml entry,
    for the schedule); returns the automations' names."""
    missing = [n for n in [*settings.on_failed, *settings.on_missed] if n not in deployments]
    if missing:
        raise NotifyConfigError(f"trinity.notify names {sorted(set(missing))}, which are not among the deployments "
                                f"registered: {sorted(deployments)}")
    block_id = notification_block_id(client, settings)
    wanted = [failure_automation(deployments[name], name, block_id) for name in settings.on_failed]
    for name in settings.on_missed:
        within, why = missed_window(settings, (declared or {}).get(name, {}), f"{where}: deployments[{name}]")
        wanted.append(missed_automation(deployments[name], name, block_id, within, why))
    names = []
    for automation in wanted:
        for old in client.read_automations_by_name(automation.name):
            client.delete_automation(old.id)
        client.create_automation(automation)
        names.append(automation.name)
    remove_stale_automations(client, deployments, keep=names)
    return names


def remove_stale_automations(client, deployments, keep: list[str] = ()) -> list[str]:
    """Delete the automations an earlier deploy made for these deployments that trinity.notify no longer asks for
    (a deployment taken out of on_failed / on_missed, or no block any more); returns their names."""
    removed = []
    for name in deployments:
        for kind in ("failed", "missed"):
            stale = f"{AUTOMATION_PREFIX}{name} {kind}"
            if stale in keep:
                continue
            for old in client.read_automations_by_name(stale):
                client.delete_automation(old.id)
                removed.append(stale)
    return removed
