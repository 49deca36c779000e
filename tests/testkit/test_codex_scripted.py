"""The real `codex app-server` (npm @openai/codex, pinned) driven against the scripted model,
with the PyPI `gitea-mcp` as the thread's MCP server talking to the Gitea emulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from forgeflow_testkit.codex_home import API_KEY, CodexHome, write_codex_home
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import (
    HttpError,
    Message,
    ScriptedModel,
    ToolCall,
    delay,
    gitea_comment,
    message,
)

ROOT = Path(__file__).resolve().parents[2]
CODEX = ROOT / "tools" / "node" / "node_modules" / ".bin" / "codex"
GITEA_MCP = Path(sys.executable).parent / "gitea-mcp"

Json = dict[str, Any]


class AppServer:
    """A tiny newline-delimited JSON-RPC client for `codex app-server` over stdio.

    The npm `codex` is a Node launcher whose child is the native server: it runs in its
    own session (process group) and the whole group is killed at the end, or the native
    process would outlive the test holding its threads' writer locks."""

    def __init__(self, home: CodexHome, stderr: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEFLOW_")}
        env.update(home.env())
        with stderr.open("ab") as err:
            self.proc = subprocess.Popen(
                [str(CODEX), "app-server"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                start_new_session=True,
            )
        self.stderr = stderr
        self.messages: list[Json] = []
        self._changed = threading.Condition()
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.messages.append(json.loads(line))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def send(self, payload: Json) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(payload).encode() + b"\n")
        self.proc.stdin.flush()

    def wait_for(self, check: Callable[[Json], bool], timeout: float = 15) -> Json:
        def found() -> Json | None:
            return next((m for m in self.messages if check(m)), None)

        with self._changed:
            self._changed.wait_for(
                lambda: found() is not None or self.proc.poll() is not None, timeout
            )
            hit = found()
        if hit is None:
            tail = self.stderr.read_text(errors="replace")[-2000:]
            raise AssertionError(f"no matching message from codex in {timeout}s; stderr:\n{tail}")
        return hit

    def request(self, method: str, params: Json, timeout: float = 15) -> Json:
        self._next_id += 1
        rid = self._next_id
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        reply = self.wait_for(lambda m: m.get("id") == rid and "method" not in m, timeout)
        assert "error" not in reply, f"{method} failed: {reply['error']}"
        result: Json = reply["result"]
        return result

    def notifications(self, method: str, since: int = 0) -> list[Json]:
        with self._changed:
            return [m["params"] for m in self.messages[since:] if m.get("method") == method]

    def server_requests(self) -> list[Json]:
        with self._changed:
            return [m for m in self.messages if "id" in m and "method" in m]

    def close(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=3)
                break
            except subprocess.TimeoutExpired:
                continue
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[GiteaEmulator]:
    with GiteaEmulator(tmp_path / "git") as emu:
        yield emu


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as scripted:
        yield scripted


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    repo = tmp_path / "work"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    return repo


@pytest.fixture
def app_server(tmp_path: Path, model: ScriptedModel) -> Iterator[AppServer]:
    assert CODEX.exists(), f"the pinned codex CLI is missing: {CODEX}"
    server = AppServer(write_codex_home(tmp_path / "codex-home", model.url), tmp_path / "codex.err")
    try:
        info = server.request(
            "initialize",
            {
                "clientInfo": {"name": "forgeflow-tests", "version": "0"},
                "capabilities": {"experimentalApi": True},
            },
        )
        assert info["codexHome"] == str(tmp_path / "codex-home")
        server.send({"jsonrpc": "2.0", "method": "initialized"})
        yield server
    finally:
        server.close()


def start_thread(server: AppServer, cwd: Path, config: dict[str, Any] | None = None) -> str:
    result = server.request(
        "thread/start",
        {
            "cwd": str(cwd),
            "approvalPolicy": "never",
            "sandbox": "danger-full-access",
            "config": config or {},
        },
    )
    thread_id: str = result["thread"]["id"]
    return thread_id


def start_turn(server: AppServer, thread_id: str, text: str) -> tuple[str, int]:
    """Returns the turn id and the index of the first message that belongs to the turn."""
    since = len(server.messages)
    result = server.request(
        "turn/start", {"threadId": thread_id, "input": [{"type": "text", "text": text}]}
    )
    assert result["turn"]["status"] == "inProgress"
    turn_id: str = result["turn"]["id"]
    return turn_id, since


def turn_completed(server: AppServer, turn_id: str, timeout: float = 20) -> Json:
    done = server.wait_for(
        lambda m: m.get("method") == "turn/completed" and m["params"]["turn"]["id"] == turn_id,
        timeout,
    )
    turn: Json = done["params"]["turn"]
    return turn


def test_codex_calls_gitea_mcp_tool_and_answers(
    app_server: AppServer, model: ScriptedModel, emulator: GiteaEmulator, workdir: Path
) -> None:
    token = emulator.add_user("ccweb-bot")
    emulator.add_user("alice")
    emulator.add_repo("acme", "widget")
    emulator.set_permission("acme", "widget", "ccweb-bot", "write")
    emulator.set_permission("acme", "widget", "alice", "write")
    issue = emulator.add_issue("acme", "widget", title="Flaky test", author="alice")
    body = "Looked into it. <!-- ccweb taskId=t1 turnKey=t1:1 resourceKey=r kind=final -->"
    call_id = model.reply_with_tool_then_message(
        gitea_comment("acme", "widget", issue, body), final="Commented on the issue."
    )

    # Both env pairs: PyPI gitea-mcp reads GITEA_URL/TOKEN, the official one GITEA_HOST/…
    gitea = {
        "command": str(GITEA_MCP),
        "args": [],
        "env": {
            "GITEA_URL": emulator.url,
            "GITEA_TOKEN": token,
            "GITEA_HOST": emulator.url,
            "GITEA_ACCESS_TOKEN": token,
        },
    }
    thread_id = start_thread(app_server, workdir, {"mcp_servers": {"gitea": gitea}})
    # codex does not wait for a thread's MCP servers before calling the model
    status = app_server.wait_for(
        lambda m: (
            m.get("method") == "mcpServer/startupStatus/updated"
            and m["params"]["name"] == "gitea"
            and m["params"]["threadId"] == thread_id
            and m["params"]["status"] in ("ready", "failed")
        ),
        timeout=20,
    )
    assert status["params"]["status"] == "ready", status

    turn_id, since = start_turn(app_server, thread_id, "@ccweb-bot please look at the flaky test")
    turn = turn_completed(app_server, turn_id)

    assert turn["status"] == "completed", turn
    comments = emulator.comments("acme", "widget", issue)
    assert [(c["body"], c["user"]["login"]) for c in comments] == [(body, "ccweb-bot")]

    completed = [p["item"] for p in app_server.notifications("item/completed", since)]
    tool_calls = [i for i in completed if i["type"] == "mcpToolCall"]
    assert len(tool_calls) == 1
    assert tool_calls[0]["id"] == call_id  # codex keeps the model's call id as the item id
    assert (tool_calls[0]["server"], tool_calls[0]["tool"]) == ("gitea", "add_comment")
    assert tool_calls[0]["status"] == "completed"
    assert tool_calls[0]["arguments"]["body"] == body
    assert json.loads(tool_calls[0]["result"]["content"][0]["text"])["id"] == comments[0]["id"]
    messages = [i["text"] for i in completed if i["type"] == "agentMessage"]
    assert messages == ["Commented on the issue."]

    usage = app_server.notifications("thread/tokenUsage/updated", since)
    assert usage and all(u["turnId"] == turn_id for u in usage)
    # two model calls of 100 input + 10 output tokens each (the scripted default usage)
    assert usage[-1]["tokenUsage"]["total"]["totalTokens"] == 220
    assert usage[-1]["tokenUsage"]["last"]["inputTokens"] == 100

    first, second = model.requests
    assert first.path == second.path == "/v1/responses"
    assert first.headers["authorization"] == f"Bearer {API_KEY}"
    assert first.body["stream"] is True
    assert first.tool("add_comment", namespace="mcp__gitea") is not None
    assert "Codex" in first.instructions
    assert first.texts("user")[-1] == "@ccweb-bot please look at the flaky test"
    output = second.last_input
    assert output is not None
    assert (output["type"], output["call_id"]) == ("function_call_output", call_id)
    assert body in output["output"]
    assert model.errors == [] and model.pending == 0
    assert app_server.server_requests() == []  # approvalPolicy never: no approval asked


def test_codex_turn_failures_and_interrupt(
    app_server: AppServer, model: ScriptedModel, workdir: Path
) -> None:
    thread_id = start_thread(app_server, workdir)

    # a model HTTP error fails the turn at once: the provider has no retries
    model.enqueue(HttpError(400, "bad request from the script"))
    turn_id, _ = start_turn(app_server, thread_id, "first")
    turn = turn_completed(app_server, turn_id)
    assert turn["status"] == "failed"
    assert "bad request from the script" in turn["error"]["message"]
    assert len(model.requests) == 1

    # a long turn (the stream stays open, kept alive) is interrupted
    model.enqueue(delay(30, Message("too late")))
    turn_id, _ = start_turn(app_server, thread_id, "second")
    model.wait_for_requests(2)
    started = time.monotonic()
    assert app_server.request("turn/interrupt", {"threadId": thread_id, "turnId": turn_id}) == {}
    turn = turn_completed(app_server, turn_id, timeout=10)
    assert turn["status"] == "interrupted"
    assert time.monotonic() - started < 5

    # the thread goes on; a shell command runs in the thread's cwd
    call_id = model.reply_with_shell_then_message("echo scripted > note.txt", final="wrote it")
    turn_id, since = start_turn(app_server, thread_id, "third")
    turn = turn_completed(app_server, turn_id)
    assert turn["status"] == "completed"
    assert (workdir / "note.txt").read_text() == "scripted\n"
    commands = [
        p["item"]
        for p in app_server.notifications("item/completed", since)
        if p["item"]["type"] == "commandExecution"
    ]
    assert [(c["id"], c["exitCode"]) for c in commands] == [(call_id, 0)]
    assert model.errors == []


def test_scripted_model_over_http() -> None:
    """The server alone: SSE shape, tool resolution against the offered tools, rules before
    the queue, and a loud failure when the script has no answer."""
    tools = [
        {"type": "function", "name": "exec_command", "parameters": {}},
        {
            "type": "namespace",
            "name": "mcp__gitea",
            "tools": [{"type": "function", "name": "issue_write", "parameters": {}}],
        },
    ]
    with ScriptedModel() as model, httpx.Client(base_url=model.url, trust_env=False) as client:
        model.enqueue(gitea_comment("acme", "widget", 3, "hi"), ToolCall("nope"))
        model.when(lambda r: r.texts("user") == ["hello"], message("hello yourself"))

        def post(text: str) -> httpx.Response:
            user = {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            }
            return client.post(
                "/responses", json={"model": "m", "stream": True, "tools": tools, "input": [user]}
            )

        def events(reply: httpx.Response) -> list[Json]:
            assert reply.headers["content-type"].startswith("text/event-stream")
            return [
                json.loads(line[6:])
                for line in reply.text.splitlines()
                if line.startswith("data: ")
            ]

        greeting = events(post("hello"))
        assert greeting[0]["type"] == "response.created"
        assert greeting[-1]["type"] == "response.completed"
        assert greeting[-1]["response"]["usage"]["total_tokens"] == 110
        done = [e["item"] for e in greeting if e["type"] == "response.output_item.done"]
        assert done[0]["content"][0]["text"] == "hello yourself"

        call = [e["item"] for e in events(post("go")) if e["type"] == "response.output_item.done"]
        assert (call[0]["name"], call[0]["namespace"]) == ("issue_write", "mcp__gitea")
        assert json.loads(call[0]["arguments"]) == {
            "method": "add_comment",
            "owner": "acme",
            "repo": "widget",
            "issue_number": 3,
            "body": "hi",
        }

        assert post("again").status_code == 500  # "nope" is not offered
        assert post("and again").status_code == 500  # nothing left in the script
        assert client.get("/models").status_code == 404
        assert len(model.errors) == 3 and "not offered" in model.errors[0]
        assert [r.path for r in model.requests][-1] == "/v1/models"


def test_update_plan_is_offered_only_when_configured(
    app_server: AppServer, model: ScriptedModel, workdir: Path
) -> None:
    """0.171.0 offers its plan tool to no model unless the config enables it; then a call
    becomes ``turn/plan/updated`` (statuses in camelCase) and the model gets its result."""
    model.enqueue(message("no plan"))
    turn_id, _ = start_turn(app_server, start_thread(app_server, workdir), "hello")
    assert turn_completed(app_server, turn_id)["status"] == "completed"
    assert model.requests[-1].tool("update_plan") is None
    plan = [{"step": "Read", "status": "completed"}, {"step": "Fix", "status": "in_progress"}]
    call_id = model.reply_with_tool_then_message("update_plan", {"plan": plan})
    planned = start_thread(app_server, workdir, {"tools": {"update_plan": {"enabled": True}}})
    turn_id, since = start_turn(app_server, planned, "make a plan")
    assert turn_completed(app_server, turn_id)["status"] == "completed", model.errors
    (update,) = app_server.notifications("turn/plan/updated", since)
    assert update["plan"] == [
        {"step": "Read", "status": "completed"},
        {"step": "Fix", "status": "inProgress"},
    ]
    outputs = [
        (o["call_id"], o["output"]) for r in model.requests for o in r.function_call_outputs()
    ]
    assert outputs == [(call_id, "Plan updated")]
