"""The rules of a repository's declared environment (domain/environment.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from forgeflow.config import load_settings
from forgeflow.domain.environment import (
    EnvironmentInvalid,
    check_secret,
    parse,
    root_key,
    setup_fingerprint,
    tail,
)
from forgeflow.services import forbidden_paths

DATA = ("/srv/forgeflow", "/srv/forgeflow/workspaces")


def field_of(raw: dict[str, object]) -> str:
    with pytest.raises(EnvironmentInvalid) as caught:
        parse(raw, DATA)  # type: ignore[arg-type]
    return caught.value.field


def test_a_valid_environment_is_normalised() -> None:
    env = parse(
        {
            "packages": ["hello", "golang-go", "hello"],
            "binds": ["/opt/jdk-21"],
            "variables": {"GOFLAGS": "-mod=mod", "PATH": "/opt/jdk-21/bin:$PATH"},
            "setupScript": "./scripts/setup-env.sh",
        },
        DATA,
    )
    assert env.packages == ("golang-go", "hello")
    assert env.setup_script == "scripts/setup-env.sh"
    assert dict(env.variables)["GOFLAGS"] == "-mod=mod"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"packages": ["Not_A_Package"]}, "packages[0]"),
        ({"packages": "hello"}, "packages"),
        ({"binds": ["/srv/forgeflow/secrets"]}, "binds[0]"),
        ({"binds": ["/srv"]}, "binds[0]"),  # holds the data folder
        ({"binds": ["/opt/a/../../srv/forgeflow"]}, "binds[0]"),
        ({"binds": ["relative/path"]}, "binds[0]"),
        ({"binds": ["/usr/lib/jvm"]}, "binds[0]"),
        ({"binds": ["/"]}, "binds[0]"),
        ({"variables": {"GITHUB_TOKEN": "x"}}, "variables.GITHUB_TOKEN"),
        ({"variables": {"DB_PASSWORD": "x"}}, "variables.DB_PASSWORD"),
        ({"variables": {"AWS_SECRET_ACCESS_KEY": "x"}}, "variables.AWS_SECRET_ACCESS_KEY"),
        ({"variables": {"HOME": "/root"}}, "variables.HOME"),
        ({"variables": {"LD_PRELOAD": "/x.so"}}, "variables.LD_PRELOAD"),
        ({"variables": {"bad name": "x"}}, "variables.bad name"),
        ({"setupScript": "/etc/passwd"}, "setupScript"),
        ({"setupScript": "../outside.sh"}, "setupScript"),
        ({"setupTimeoutSeconds": 0}, "setupTimeoutSeconds"),
        ({"suite": "Bookworm!"}, "suite"),
        ({"mirror": "http://evil"}, "mirror"),
    ],
)
def test_bad_input_names_its_field(raw: dict[str, object], field: str) -> None:
    assert field_of(raw) == field


def test_a_setup_secret_needs_a_name_and_a_value() -> None:
    assert check_secret("SETUP_TOKEN", "abc") == "abc"
    with pytest.raises(EnvironmentInvalid) as caught:
        check_secret("HOME", "x")
    assert caught.value.field == "secrets.HOME"


def test_the_root_key_is_the_sorted_list_and_the_suite() -> None:
    a = root_key(parse({"packages": ["bc", "a1"]}, DATA), "bookworm", ("git",))
    b = root_key(parse({"packages": ["a1", "bc"]}, DATA), "bookworm", ("git",))
    c = root_key(parse({"packages": ["a1", "bc"], "suite": "trixie"}, DATA), "bookworm", ("git",))
    assert a is not None and b is not None and c is not None
    assert a.key == b.key != c.key
    assert a.packages == ("a1", "bc", "git")
    assert root_key(parse({}, DATA), "bookworm", ("git",)) is None


def test_the_setup_fingerprint_changes_with_script_root_and_secrets() -> None:
    env = parse({"setupScript": "s.sh"}, DATA)
    base = setup_fingerprint(env, "r1", "sha1", {"A": "1"})
    assert base == setup_fingerprint(env, "r1", "sha1", {"A": "1"})
    assert base != setup_fingerprint(env, "r2", "sha1", {"A": "1"})
    assert base != setup_fingerprint(env, "r1", "sha2", {"A": "1"})
    assert base != setup_fingerprint(env, "r1", "sha1", {"A": "2"})


def test_a_tail_is_bounded_and_starts_at_a_line() -> None:
    log = "".join(f"line {i}\n" for i in range(1000))
    end = tail(log, 200)
    assert len(end) <= 200 and end.startswith("line ") and end.endswith("line 999\n")


def test_binds_never_reach_forgeflow_s_folders_wherever_the_operator_put_them(
    tmp_path: Path,
) -> None:
    config = tmp_path / "forgeflow.toml"
    config.write_text("")
    s = load_settings(
        config,
        data_dir=Path("/srv/ff/data"),
        environment_roots=Path("/srv/ff-roots"),
        codex_home=Path("/srv/operator/codex"),
    )
    forbidden = forbidden_paths(s)
    # The roots' lock files (a jail flocking one stalls that list's builds), the model's
    # credentials, and above them: each refused.
    for bind in ["/srv/ff-roots", "/srv/operator", "/srv/operator/codex/x", "/srv"]:
        with pytest.raises(EnvironmentInvalid, match="forgeflow's own folder"):
            parse({"binds": [bind]}, forbidden)
    assert str(config.resolve()) in forbidden  # its tokens: not bound, nor its folder
    parse({"binds": ["/srv/toolchains"]}, forbidden)
