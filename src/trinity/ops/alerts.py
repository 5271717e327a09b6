"""A Failed scheduled run notifies someone: a Prefect Automation per deployment named in prefect.yaml's
`trinity.notify` section, created (or replaced) by `flows/deploy.py` right after the deployments are registered.

    trinity:
      notify:
        on_failed: [nightly-eval]    # deployments whose Failed runs notify
        block: slack-webhook/ops     # an existing Prefect notification block, "<block type slug>/<block name>"
        webhook_url: null            # or a URL: deploy saves a custom-webhook block that POSTs JSON there

The automation's trigger is the server's own event, `prefect.flow-run.Failed`, for a flow run of that deployment
(reactive, each one); its action sends the block a subject naming the deployment and run, and a body with the
run's state message (for nightly-eval: the drop that failed it) and its id. Prefect's server evaluates triggers
and runs actions itself, so nothing else needs to be running. `prefect automation ls` lists them.

With neither `block` nor `webhook_url`, no automation is created and deploy says so: a Failed run then notifies
nobody.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

AUTOMATION_PREFIX = "trinity: "
WEBHOOK_BLOCK_NAME = "trinity-failed-runs"
"""The custom-webhook notification block deploy saves for `webhook_url`."""

SUBJECT = "Trinity: {{ deployment.name }} run {{ flow_run.name }} failed"
BODY = ("{{ deployment.name }} run {{ flow_run.name }} ({{ flow_run.id }}) ended Failed: "
        "{{ flow_run.state.message }}")


class NotifyConfigError(ValueError):
    """prefect.yaml's trinity.notify section is malformed; the message names the key."""


@dataclass(frozen=True)
class NotifySettings:
    on_failed: list[str] = field(default_factory=list)
    block: str | None = None
    webhook_url: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.on_failed) and bool(self.block or self.webhook_url)


def notify_settings(doc: dict, where: str) -> NotifySettings:
    """Read `trinity.notify` of a prefect.yaml document (`where`: the file, for messages)."""
    section = ((doc or {}).get("trinity") or {}).get("notify")
    if section is None:
        return NotifySettings()
    if not isinstance(section, dict):
        raise NotifyConfigError(f"{where}: trinity.notify must be a mapping (on_failed, block, webhook_url)")
    unknown = set(section) - {"on_failed", "block", "webhook_url"}
    if unknown:
        raise NotifyConfigError(f"{where}: trinity.notify: unknown key(s) {sorted(unknown)} (expected on_failed, "
                                "block, webhook_url)")
    on = section.get("on_failed") or []
    if not isinstance(on, list) or not all(isinstance(n, str) and n for n in on):
        raise NotifyConfigError(f"{where}: trinity.notify.on_failed must be a list of deployment names, got {on!r}")
    block, url = section.get("block"), section.get("webhook_url")
    if block is not None and (not isinstance(block, str) or block.count("/") != 1 or not all(block.split("/"))):
        raise NotifyConfigError(f"{where}: trinity.notify.block must be '<block type slug>/<block name>' (e.g. "
                                f"slack-webhook/ops), got {block!r}")
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        raise NotifyConfigError(f"{where}: trinity.notify.webhook_url must be an http(s) URL, got {url!r}")
    if block and url:
        raise NotifyConfigError(f"{where}: trinity.notify: give block or webhook_url, not both")
    return NotifySettings(on_failed=list(on), block=block, webhook_url=url)


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


def failure_automation(deployment_id: UUID, deployment_name: str, block_id: UUID) -> Any:
    """The automation: each Failed flow run of the deployment sends the block SUBJECT and BODY."""
    from datetime import timedelta

    from prefect.automations import AutomationCore, EventTrigger, Posture, SendNotification

    return AutomationCore(
        name=f"{AUTOMATION_PREFIX}{deployment_name} failed",
        description=f"Created by flows/deploy.py: notify when a run of deployment {deployment_name} ends Failed",
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={"prefect.resource.role": "deployment",
                           "prefect.resource.id": f"prefect.deployment.{deployment_id}"},
            expect={"prefect.flow-run.Failed"}, posture=Posture.Reactive, threshold=1, within=timedelta(0)),
        actions=[SendNotification(block_document_id=block_id, subject=SUBJECT, body=BODY)])


def ensure_failure_automations(client, settings: NotifySettings, deployments: dict[str, UUID]) -> list[str]:
    """Replace the automation of each deployment in `settings.on_failed` (`deployments`: registered name → id);
    returns the automations' names."""
    missing = [n for n in settings.on_failed if n not in deployments]
    if missing:
        raise NotifyConfigError(f"trinity.notify.on_failed names {missing}, which are not among the deployments "
                                f"registered: {sorted(deployments)}")
    block_id = notification_block_id(client, settings)
    names = []
    for name in settings.on_failed:
        automation = failure_automation(deployments[name], name, block_id)
        for old in client.read_automations_by_name(automation.name):
            client.delete_automation(old.id)
        client.create_automation(automation)
        names.append(automation.name)
    return names
