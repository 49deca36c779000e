"""The command line as an operator meets it: real processes, real sockets."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import httpx

from tests.support.process import FORGEFLOW, clean_env, free_port, start_serve, wait_healthy


def test_version() -> None:
    out = subprocess.run([FORGEFLOW, "version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("forgeflow ")


def test_invalid_setting_stops_with_one_line_and_exit_2(tmp_path: Path) -> None:
    env = clean_env(FORGEFLOW_DATA_DIR=str(tmp_path), FORGEFLOW_TRIGGER_PERMISSION="root")
    out = subprocess.run([FORGEFLOW, "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "FORGEFLOW_TRIGGER_PERMISSION" in lines[0]


def test_migrate_alone(tmp_path: Path) -> None:
    env = clean_env(FORGEFLOW_DATA_DIR=str(tmp_path))
    out = subprocess.run(
        [FORGEFLOW, "migrate"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "forgeflow.db").is_file()


def test_serve_starts_unconfigured_and_says_what_it_cannot_do(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(FORGEFLOW_DATA_DIR=str(tmp_path / "data"), FORGEFLOW_PORT=str(port))
    log = tmp_path / "serve.log"
    proc = start_serve(env, stderr_path=log)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        r = httpx.post(f"http://127.0.0.1:{port}/api/gitea/webhook", content=b"{}")
        assert r.status_code == 503 and r.json()["error"] == "not_configured"
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz")
        assert ready.status_code == 200
        # The jail is the default, and nothing warns about it.
        assert ready.json()["sandbox"] == "bwrap" and "warnings" not in ready.json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = log.read_text()
    assert "FORGEFLOW_WEBHOOK_SECRET is not set" in text
    assert "FORGEFLOW_GITEA_URL is not set" in text
    token_file = tmp_path / "data" / "admin_token"
    token = token_file.read_text().strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert text.count(token) == 1
    # A second start keeps the token and does not print it again.
    proc = start_serve(env, stderr_path=log)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        r = httpx.get(
            f"http://127.0.0.1:{port}/api/gitea-workflow/overview",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert log.read_text().count(token) == 1


def test_serve_refuses_a_jail_that_cannot_work_with_one_line(tmp_path: Path) -> None:
    # No bwrap on this PATH (an empty folder): the jail cannot start, so neither does serve.
    empty = tmp_path / "bin"
    empty.mkdir()
    env = clean_env(FORGEFLOW_DATA_DIR=str(tmp_path / "data"), PATH=str(empty))
    out = subprocess.run([FORGEFLOW, "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    refusal = [line for line in out.stderr.splitlines() if "FORGEFLOW_SANDBOX" in line]
    assert len(refusal) == 1 and out.stderr.strip().endswith(refusal[0])
    assert "bubblewrap is not installed" in refusal[0]
    assert "apt-get install bubblewrap" in refusal[0]
    # doctor says the same, with the fix.
    out = subprocess.run(
        [FORGEFLOW, "doctor"], env=env, capture_output=True, text=True, timeout=120
    )
    line = next(x for x in out.stdout.splitlines() if "sandbox" in x)
    assert line.startswith("[FAIL]") and "apt-get install bubblewrap" in line
    assert out.returncode == 1


def test_serve_without_a_jail_says_so_at_start_in_readyz_and_on_the_overview(
    tmp_path: Path,
) -> None:
    port = free_port()
    env = clean_env(
        FORGEFLOW_DATA_DIR=str(tmp_path / "data"),
        FORGEFLOW_PORT=str(port),
        FORGEFLOW_SANDBOX="none",
        FORGEFLOW_ADMIN_TOKEN="admin-token-for-this-test",
    )
    log = tmp_path / "serve.log"
    proc = start_serve(env, stderr_path=log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        ready = httpx.get(f"{base}/readyz").json()
        assert ready["sandbox"] == "none"
        assert ready["warnings"] and "unjailed" in ready["warnings"][0]
        with httpx.Client(base_url=base, timeout=30) as client:
            form = client.get("/ui/login").text
            csrf = form.split('name="csrf" value="', 1)[1].split('"', 1)[0]
            signed = client.post(
                "/ui/login",
                data={"csrf": csrf, "token": "admin-token-for-this-test", "operator": "op"},
            )
            assert signed.status_code == 303
            page = client.get("/ui/").text
        assert 'id="ov-sandbox"' in page and "unjailed" in page
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "WARNING: FORGEFLOW_SANDBOX=none" in log.read_text()


def test_serve_refuses_an_unreadable_model_provider_with_one_line(tmp_path: Path) -> None:
    home = tmp_path / "codex"
    home.mkdir()
    (home / "config.toml").write_text("model = [\n")
    env = clean_env(FORGEFLOW_DATA_DIR=str(tmp_path / "data"), CODEX_HOME=str(home))
    out = subprocess.run([FORGEFLOW, "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert "cannot read the model provider" in last and str(home / "config.toml") in last


def test_a_config_typo_or_folder_stops_serve_with_one_line(tmp_path: Path) -> None:
    env = clean_env(FORGEFLOW_DATA_DIR=str(tmp_path / "data"))
    typo = tmp_path / "forgeflow.toml"
    typo.write_text('[forgeflow]\nwebhook_secet = "x"\n')
    for config, named in (
        (typo, f"{typo}: unknown key [forgeflow] 'webhook_secet'"),
        (tmp_path, f"{tmp_path} is a folder"),
    ):
        out = subprocess.run(
            [FORGEFLOW, "serve", "--config", str(config)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2, out.stderr
        [line] = out.stderr.strip().splitlines()
        assert line.startswith("forgeflow: invalid configuration: --config: ") and named in line


def test_a_second_serve_on_one_data_folder_is_refused_and_a_killed_ones_lock_is_free(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    port = free_port()
    env = clean_env(FORGEFLOW_DATA_DIR=str(data), FORGEFLOW_PORT=str(port))
    first = start_serve(env, stderr_path=tmp_path / "first.log")
    try:
        wait_healthy(f"http://127.0.0.1:{port}", first)
        # Another port, the same folder: refused before it migrates or binds anything.
        second = subprocess.run(
            [FORGEFLOW, "serve", "--port", str(free_port())],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        [line] = second.stderr.strip().splitlines()
        assert f"the data folder {data} is in use by forgeflow (pid {first.pid}," in line
        assert "FORGEFLOW_DATA_DIR" in line
    finally:
        first.kill()  # SIGKILL: no clean-up, the kernel drops the lock
        first.wait(timeout=30)
    assert (data / "serve.lock").read_text().strip() == str(first.pid)
    again = start_serve(env, stderr_path=tmp_path / "again.log")
    try:
        wait_healthy(f"http://127.0.0.1:{port}", again)
        assert (data / "serve.lock").read_text().strip() == str(again.pid)
    finally:
        again.terminate()
        again.wait(timeout=30)


def test_serve_names_what_it_cannot_do_and_where_the_admin_pages_are(tmp_path: Path) -> None:
    port = free_port()
    home = tmp_path / "codex-home"  # no provider configured, no key anywhere
    home.mkdir()
    env = clean_env(
        FORGEFLOW_DATA_DIR=str(tmp_path / "data"),
        FORGEFLOW_PORT=str(port),
        FORGEFLOW_GITEA_MCP_COMMAND="/nonexistent/gitea-mcp",
        CODEX_HOME=str(home),
    )
    env.pop("OPENAI_API_KEY", None)
    log = tmp_path / "serve.log"
    proc = start_serve(env, stderr_path=log)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lines = log.read_text().splitlines()

    def one(start: str) -> str:
        [line] = [x for x in lines if x.startswith("forgeflow: " + start)]
        return line

    assert "503 not_configured" in one("FORGEFLOW_WEBHOOK_SECRET is not set")
    assert one("FORGEFLOW_GITEA_URL is not set")
    assert one("FORGEFLOW_GITEA_TOKEN is not set")
    model = one("FORGEFLOW_MODEL_BASE_URL and FORGEFLOW_MODEL_API_KEY are not set")
    assert "https://api.openai.com/v1" in model and "turns fail" in model
    assert "mcp_command_missing" in one("FORGEFLOW_GITEA_MCP_COMMAND names '/nonexistent/")
    pages = one("admin pages at ")
    assert pages == (
        f"forgeflow: admin pages at http://127.0.0.1:{port}/ui/ "
        f"(sign in with the admin token in {tmp_path / 'data' / 'admin_token'})"
    )
    # With a base URL and no key, the line names the key and the address.
    proc = start_serve(env | {"FORGEFLOW_MODEL_BASE_URL": "http://127.0.0.1:9/v1"}, stderr_path=log)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert any(
        x.startswith("forgeflow: FORGEFLOW_MODEL_API_KEY is not set: http://127.0.0.1:9/v1 ")
        for x in log.read_text().splitlines()
    )
