"""The bot token is masked in the forms it travels in, not only as itself."""

from __future__ import annotations

import base64
from urllib.parse import quote

from forgeflow.redaction import MASK, forget_secrets, redact_text, register_secrets

TOKEN = "0123456789abcdef+/token=value"


def test_base64_of_user_and_token_url_encoding_and_auth_headers_are_masked() -> None:
    register_secrets([TOKEN], usernames=("ccweb-bot",))
    try:
        for user in ("forgeflow", "ccweb-bot"):
            basic = base64.b64encode(f"{user}:{TOKEN}".encode()).decode()
            assert redact_text(f"Authorization: Basic {basic}") == f"Authorization: Basic {MASK}"
            assert basic not in redact_text(f"curl said {basic} and {basic.rstrip('=')}")
        assert quote(TOKEN, safe="") not in redact_text(f"url=https://h/?t={quote(TOKEN, safe='')}")
        # An Authorization header carries a credential whatever it is.
        assert (
            redact_text("authorization: Bearer abc.def-unknown") == f"authorization: Bearer {MASK}"
        )
        assert redact_text("an ordinary sentence") == "an ordinary sentence"
    finally:
        forget_secrets([TOKEN])
    assert TOKEN in redact_text(TOKEN)  # forgotten, with its forms


def test_hex_and_base64_inside_longer_text_are_masked() -> None:
    secret = "setup-only-s3cr3t-4f9c2e"
    register_secrets([secret])
    try:
        assert secret.encode().hex() not in redact_text(f"xxd: {secret.encode().hex()}")
        assert secret.encode().hex().upper() not in redact_text(secret.encode().hex().upper())
        # base64 of the secret inside other bytes (a user name no one registered, JSON
        # around it): at each of the three alignments, nothing of it stays readable.
        for before in ("", "u", "someone:", '{"auth":"'):
            for after in ("", "\n", '"}'):
                encoded = base64.b64encode(f"{before}{secret}{after}".encode()).decode()
                masked = redact_text(f"config {encoded} end")
                assert MASK in masked, (before, after)
                # What is left around the mask is the encoding of what was around the
                # secret, and at most a group's worth of characters more on each side.
                lead, _, rest = masked.split(" ")[1].partition(MASK)
                assert len(lead) <= len(base64.b64encode(before.encode())) + 4, masked
                assert len(rest) <= len(base64.b64encode(after.encode())) + 8, masked
    finally:
        forget_secrets([secret])
