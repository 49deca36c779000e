"""forgeflow's OAuth2 application in Gitea, made or repaired by ``forgeflow gitea connect
--oauth`` as the bot's account: ``/api/v1/user/applications/oauth2`` (Gitea 1.22
routers/api/v1/user/app.go; structs.OAuth2Application, CreateOAuth2ApplicationOptions).

Gitea shows a client secret once, when it makes one: on create, and on every update
("this includes regenerating the client secret"). So repairing the application always
yields a new secret, which is stored at once.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, SecretStr

from forgeflow.domain.json import JsonObject
from forgeflow.gitea.transport import Transport

APP_NAME = "forgeflow"
CLIENT_FILE = "gitea_oauth.json"  # in the data folder, 0600, like the admin token


class OAuthApplication(BaseModel):
    id: int
    name: str
    client_id: str
    client_secret: str = ""
    confidential_client: bool = False
    redirect_uris: list[str] = []


@dataclass(frozen=True, slots=True)
class Outcome:
    action: str  # "create", "update" or "none"
    app: OAuthApplication
    why: str = ""


APPS = "/user/applications/oauth2"


class OAuthAppsApi(Transport):
    """The token's account's OAuth2 applications (a part of the Gitea client)."""

    async def oauth_applications(self) -> list[OAuthApplication]:
        found: list[OAuthApplication] = []
        page = 1
        while True:
            params = {"page": str(page), "limit": "50"}
            batch = await self._many(OAuthApplication, "GET", APPS, (200,), params=params)
            found += batch
            if len(batch) < 50:
                return found
            page += 1

    async def create_oauth_application(self, body: JsonObject) -> OAuthApplication:
        return await self._one(OAuthApplication, "POST", APPS, (201,), json=body)

    async def update_oauth_application(self, app_id: int, body: JsonObject) -> OAuthApplication:
        path = f"{APPS}/{int(app_id)}"
        return await self._one(OAuthApplication, "PATCH", path, (200,), json=body)


async def connect(
    client: OAuthAppsApi, redirect_uri: str, stored_client_id: str | None, *, dry_run: bool
) -> Outcome:
    """Create the application, or update it (a new secret) when its redirect URI is not
    exactly ours, it is not confidential, or forgeflow holds no secret for it."""
    body: JsonObject = {
        "name": APP_NAME,
        "confidential_client": True,
        "redirect_uris": [redirect_uri],
    }
    mine = [a for a in await client.oauth_applications() if a.name == APP_NAME]
    app = next((a for a in mine if a.client_id == stored_client_id), mine[0] if mine else None)
    if app is None:
        if dry_run:
            return Outcome("create", OAuthApplication(id=0, name=APP_NAME, client_id=""))
        return Outcome("create", await client.create_oauth_application(body))
    reasons = []
    if app.redirect_uris != [redirect_uri]:
        reasons.append(f"redirect URI {app.redirect_uris} → {redirect_uri}")
    if not app.confidential_client:
        reasons.append("not a confidential client")
    if app.client_id != stored_client_id:
        reasons.append("forgeflow holds no secret for it")
    if not reasons:
        return Outcome("none", app)
    if dry_run:
        return Outcome("update", app, "; ".join(reasons))
    updated = await client.update_oauth_application(app.id, body)
    return Outcome("update", updated, "; ".join(reasons))


def read_client(data_dir: Path) -> tuple[str, SecretStr] | None:
    """The stored client id and secret, or None."""
    path = data_dir / CLIENT_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return str(data["client_id"]), SecretStr(str(data["client_secret"]))
    except (ValueError, KeyError, TypeError):
        return None


def store_client(data_dir: Path, client_id: str, secret: str) -> Path:
    """Write the client id and secret (0600, replaced atomically)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / CLIENT_FILE
    tmp = data_dir / (CLIENT_FILE + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"client_id": client_id, "client_secret": secret}, fh)
    os.replace(tmp, path)
    return path
