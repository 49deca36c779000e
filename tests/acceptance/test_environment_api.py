"""A repository's environment through the control API (issue #26): set, read back,
validated with the field named, setup secrets never answered nor audited."""

from __future__ import annotations

from tests.support.world import World

REPO = "/api/gitea-workflow/repos/default:acme/widget/environment"


def test_an_environment_is_set_read_and_audited(world: World) -> None:
    body = {
        "requestId": "env-1",
        "operator": "alice",
        "environment": {
            "packages": ["hello"],
            "variables": {"GOFLAGS": "-mod=mod"},
            "setupScript": "scripts/setup.sh",
        },
    }
    with world.ff.admin() as admin:
        assert admin.get(REPO).json()["environment"]["packages"] == []
        r = admin.put(REPO, json=body)
        assert r.status_code == 200, r.text
        assert r.json()["environment"]["packages"] == ["hello"]
        assert r.json()["operator"] == "admin:alice"
        again = admin.put(REPO, json=body)
        assert again.json()["replayed"] is True
        got = admin.get(REPO).json()
        assert got["environment"]["setupScript"] == "scripts/setup.sh"
        assert got["environment"]["variables"] == {"GOFLAGS": "-mod=mod"}
        assert got["root"] is None and got["setup"] is None  # nothing built yet
        actions = [e["action"] for e in admin.get("/api/gitea-workflow/audit").json()["items"]]
        assert actions.count("environment.set") == 1


def test_bad_environments_are_refused_naming_the_field(world: World) -> None:
    data = str(world.ff.settings.data_dir)
    cases = {
        "binds[0]": {"binds": [data + "/run"]},
        "variables.NPM_TOKEN": {"variables": {"NPM_TOKEN": "x"}},
        "packages[0]": {"packages": ["Bad Name"]},
        "setupScript": {"setupScript": "/bin/sh"},
    }
    with world.ff.admin() as admin:
        for i, (field, env) in enumerate(cases.items()):
            r = admin.put(REPO, json={"requestId": f"bad-{i}", "environment": env})
            assert r.status_code == 400, r.text
            assert r.json()["error"] == "invalid_environment"
            assert r.json()["field"] == field and field in r.json()["message"]
        wrong = admin.get("/api/gitea-workflow/repos/acme/widget/environment")
        assert wrong.status_code == 404 and wrong.json()["error"] == "repository_not_found"


def test_setup_secrets_are_answered_by_name_only(world: World) -> None:
    value = "s3cr3t-value-for-setup-only"
    with world.ff.admin() as admin:
        r = admin.put(
            REPO + "/secrets",
            json={"requestId": "sec-1", "secrets": {"SETUP_TOKEN": value}},
        )
        assert r.status_code == 200, r.text
        assert r.json()["setupSecrets"] == ["SETUP_TOKEN"]
        assert value not in r.text
        assert value not in admin.get(REPO).text
        audit = admin.get("/api/gitea-workflow/audit", params={"format": "jsonl"}).text
        assert "SETUP_TOKEN" in audit and value not in audit
        bad = admin.put(REPO + "/secrets", json={"requestId": "sec-2", "secrets": {"PATH": "x"}})
        assert bad.status_code == 400 and bad.json()["field"] == "secrets.PATH"
        gone = admin.put(
            REPO + "/secrets", json={"requestId": "sec-3", "secrets": {"SETUP_TOKEN": None}}
        )
        assert gone.json()["setupSecrets"] == []


def test_variables_the_host_s_loader_reads_are_refused(world: World) -> None:
    # bwrap is started on the host with the jail's environment: LD_DEBUG_OUTPUT had its
    # loader write a file at a host path, GLIBC_TUNABLES reaches its loader's parser.
    names = ["LD_DEBUG_OUTPUT", "LD_DEBUG", "ld_profile", "GLIBC_TUNABLES", "MALLOC_TRACE",
             "GCONV_PATH", "LOCPATH", "HOSTALIASES", "RES_OPTIONS"]  # fmt: skip
    with world.ff.admin() as admin:
        for i, name in enumerate(names):
            env = {"variables": {name: "/tmp/forgeflow-loader-trace"}}
            r = admin.put(REPO, json={"requestId": f"ld-{i}", "environment": env})
            assert r.status_code == 400, (name, r.text)
            assert r.json()["field"] == f"variables.{name}"
            secret = {"requestId": f"lds-{i}", "secrets": {name: "value-of-a-secret"}}
            r = admin.put(REPO + "/secrets", json=secret)
            assert r.status_code == 400, (name, r.text)
            assert r.json()["field"] == f"secrets.{name}"
