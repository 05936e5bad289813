"""The user's Hugging Face access token: kept in the OS keyring (Windows Credential Manager, macOS Keychain, the
Secret Service on Linux), never in a run config, a settings file or a log.

Where Hone looks, in order: the keyring entry Hone saved, the HF_TOKEN environment variable, the token `hf auth
login` saved. A machine without a keyring backend (a headless server) cannot save one; it uses the other two.
"""

from __future__ import annotations

import os

from hone.core.hub.connection import HubError

SERVICE = "hone-studio"  # the keyring's service name
ACCOUNT = "huggingface-token"  # the entry under it


def keyring_problem() -> str:
    """Why no token can be kept in the OS keyring here, in words; "" when one can."""
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:
        return "the keyring package is not installed (pip install keyring)"
    try:
        backend = keyring.get_keyring()
    except Exception as e:  # a backend that fails to load raises its own errors
        return f"the OS keyring cannot be opened ({type(e).__name__}: {e})"
    if isinstance(backend, fail.Keyring) or getattr(backend, "priority", 1) <= 0:
        return "this computer has no OS keyring service running (on Linux: GNOME Keyring or KWallet)"
    return ""


def stored_token() -> str | None:
    """The token saved in the OS keyring, or None (none saved, or no keyring)."""
    if keyring_problem():
        return None
    import keyring

    try:
        return keyring.get_password(SERVICE, ACCOUNT) or None
    except Exception:  # a locked or broken keyring reads as "no token": the Hub then says what access is missing
        return None


def save_token(token: str) -> None:
    """Keep `token` in the OS keyring.

    Raises:
        HubError: the token is empty or not a Hugging Face token, or there is no keyring to keep it in.
    """
    token = token.strip()
    if not token:
        raise HubError("the token is empty", "paste the token from huggingface.co/settings/tokens")
    if any(c.isspace() for c in token):
        raise HubError("a Hugging Face token has no spaces in it", "paste the token alone, as the Hub shows it")
    problem = keyring_problem()
    if problem:
        raise HubError(
            f"the token cannot be kept: {problem}",
            "set HF_TOKEN in the environment, or run `hf auth login`; Hone never writes a token into "
            "its settings or a run config",
        )
    import keyring

    try:
        keyring.set_password(SERVICE, ACCOUNT, token)
    except Exception as e:
        raise HubError(
            f"the OS keyring refused the token ({type(e).__name__}: {e})",
            "unlock the keyring and try again, or set HF_TOKEN in the environment",
        ) from None


def forget_token() -> bool:
    """Remove Hone's token from the OS keyring; True when there was one."""
    if stored_token() is None:
        return False
    import keyring

    try:
        keyring.delete_password(SERVICE, ACCOUNT)
    except Exception:
        return False
    return True


def hub_token() -> tuple[str | None, str]:
    """The token to send and where it came from ("the OS keyring", "HF_TOKEN", "hf auth login"); (None, "")
    when there is none."""
    token = stored_token()
    if token:
        return token, "the OS keyring"
    if os.environ.get("HF_TOKEN", "").strip():
        return os.environ["HF_TOKEN"].strip(), "HF_TOKEN"
    from huggingface_hub import get_token

    token = get_token()
    return (token, "hf auth login") if token else (None, "")
