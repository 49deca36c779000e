"""``forgeflow gitea connect|disconnect``: the Gitea webhook, created or updated idempotently.

The plan is computed from what Gitea has (a hook is ours when its URL is ours), then
applied; a dry run prints the plan only. Gitea never returns a hook's secret, so the
secret is set on create and on every update, and cannot be compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote

from forgeflow.domain.ids import validate_name
from forgeflow.gitea.client import GiteaClient
from forgeflow.gitea.models import Hook, HookOption

# The comment events that trigger tasks, and the events pipelines listen to.
HOOK_EVENTS = (
    "issue_comment",
    "pull_request_comment",
    "issues",
    "issue_assign",
    "pull_request",
    "pull_request_sync",
    "release",
)


@dataclass(frozen=True, slots=True)
class Target:
    """``OWNER/REPO`` (a repository hook) or ``ORG`` (an organisation hook)."""

    owner: str
    repo: str | None = None

    @classmethod
    def parse(cls, text: str) -> Target:
        owner, _, repo = text.partition("/")
        validate_name(owner, "owner")
        if repo:
            validate_name(repo, "repository")
        return cls(owner, repo or None)

    @property
    def base(self) -> str:
        if self.repo:
            return f"/repos/{quote(self.owner, safe='')}/{quote(self.repo, safe='')}"
        return f"/orgs/{quote(self.owner, safe='')}"

    def __str__(self) -> str:
        return f"{self.owner}/{self.repo}" if self.repo else f"organisation {self.owner}"


@dataclass
class Plan:
    action: str  # create | update | none | delete
    hook_id: int | None = None
    changes: list[str] = field(default_factory=list)


def desired(url: str, secret: str) -> HookOption:
    return HookOption(
        events=list(HOOK_EVENTS),
        config={"url": url, "content_type": "json", "secret": secret},
    )


def _ours(hooks: list[Hook], url: str) -> list[Hook]:
    return [h for h in hooks if h.config.get("url") == url]


def plan_connect(hooks: list[Hook], url: str) -> Plan:
    ours = _ours(hooks, url)
    if not ours:
        return Plan("create")
    hook = ours[0]
    changes = []
    if not hook.active:
        changes.append("active")
    # Gitea answers with its expansion of "issues"/"pull_request" into sub-events, so
    # ours must all be there; events someone added beside them are left alone.
    if not set(HOOK_EVENTS) <= set(hook.events):
        changes.append("events")
    if hook.config.get("content_type") != "json":
        changes.append("content_type")
    return Plan("update" if changes else "none", hook.id, changes)


async def connect(
    client: GiteaClient,
    target: Target,
    *,
    url: str,
    secret: str,
    dry_run: bool,
    update_secret: bool = False,
) -> Plan:
    """``update_secret``: set the secret of a hook that is otherwise up to date (Gitea
    never shows it, so only the operator knows whether it changed)."""
    plan = plan_connect(await client.list_hooks(target.base), url)
    if update_secret and plan.action == "none":
        plan = Plan("update", plan.hook_id, ["secret"])
    if dry_run or plan.action == "none":
        return plan
    body = desired(url, secret)
    if plan.action == "create":
        plan.hook_id = (await client.create_hook(target.base, body)).id
    else:
        assert plan.hook_id is not None
        await client.edit_hook(target.base, plan.hook_id, body)
    return plan


async def disconnect(client: GiteaClient, target: Target, *, url: str, dry_run: bool) -> list[int]:
    ids = [h.id for h in _ours(await client.list_hooks(target.base), url)]
    if not dry_run:
        for hook_id in ids:
            await client.delete_hook(target.base, hook_id)
    return ids
