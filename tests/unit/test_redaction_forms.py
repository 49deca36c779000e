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
