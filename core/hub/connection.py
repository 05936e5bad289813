"""Where the Hub is, where its downloads go, and what its errors mean in words.

Every setting is read when a call is made, not when huggingface_hub was imported: `HF_ENDPOINT` (a mirror, or the
tests' fake Hub), `HF_HUB_CACHE` / `HF_HOME` (the cache folder) and `HF_HUB_OFFLINE`. Each call passes the endpoint
and cache folder to huggingface_hub explicitly.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from hone.core.errors import ModelError

DEFAULT_ENDPOINT = "https://huggingface.co"
# Seconds a search or a file's metadata may take: long enough for a slow link, short enough that a machine without
# one is told at once (the same budget as hone.core.models.load.check_hub_model).
TIMEOUT_S = 10
_TRUE = {"1", "on", "yes", "true"}


class HubError(ModelError):
    """A Hub request failed for a reason the user can act on. `code` names it for a front end that offers the fix:
    hub-offline, hub-gated, hub-not-found, hub-revision, hub-file, hub-server; a push adds hub-token (none, or one
    the Hub refuses), hub-write (the token may not write there), hub-repo-id and hub-folder (not an export)."""

    def __init__(self, message: str, advice: str = "", code: str = ""):
        super().__init__(message, advice)
        self.code = code


def endpoint() -> str:
    """The Hub's address: HF_ENDPOINT when set (a mirror, a test server), else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def cache_dir() -> Path:
    """The Hugging Face cache that transformers reads models from (HF_HUB_CACHE, else HF_HOME/hub, else the
    default huggingface_hub chose)."""
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(key):
            return Path(os.environ[key]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def check_online() -> None:
    """Raise HubError when the user switched the Hub off (HF_HUB_OFFLINE), before any request is tried."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE or constants.HF_HUB_OFFLINE:
        raise HubError(
            "HF_HUB_OFFLINE is set, so Hone does not contact the Hugging Face Hub",
            "unset HF_HUB_OFFLINE (and start Hone again) to search and download; models already "
            "downloaded work without it",
            "hub-offline",
        )


def unreachable(kind: str) -> HubError:
    return HubError(
        f"the Hugging Face Hub ({endpoint()}) cannot be reached ({kind})",
        "check the internet connection (and HTTPS_PROXY behind a proxy), then try again; models already "
        "downloaded still work offline",
        "hub-offline",
    )


def gated(repo_id: str, with_token: bool) -> HubError:
    page = f"{endpoint()}/{repo_id}"
    if with_token:
        return HubError(
            f"{repo_id} is gated and the token Hone has is not granted access to it",
            f"accept its license on {page} with the account the token belongs to (access to some "
            "models is reviewed first), then download again",
            "hub-gated",
        )
    return HubError(
        f"{repo_id} is gated: its license must be accepted on huggingface.co before it can be downloaded",
        f"accept it on {page}, create a read token on {endpoint()}/settings/tokens and give it to Hone "
        "(`hone models login`, or Token… in Search the Hub); Hone keeps it in the OS keyring",
        "hub-gated",
    )


@contextlib.contextmanager
def hub_errors(repo_id: str = "", revision: str = "", with_token: bool = False):
    """Turn what huggingface_hub and its HTTP client raise into one HubError with advice.

    Args:
        repo_id: the model asked for ("" for a search).
        revision: the branch, tag or commit asked for ("" for the newest).
        with_token: a token was sent (a gated model then means access was not granted, not that none was given).
    """
    from huggingface_hub import errors

    try:
        yield
    except HubError:
        raise
    except errors.GatedRepoError:
        raise gated(repo_id, with_token) from None
    except errors.RevisionNotFoundError:
        raise HubError(
            f"{repo_id} has no revision {revision!r} on the Hugging Face Hub",
            "leave the revision empty for the newest (main), or give a branch, tag or commit that exists",
            "hub-revision",
        ) from None
    except errors.RepositoryNotFoundError:
        raise HubError(
            f"there is no model named {repo_id!r} on the Hugging Face Hub (or it is private)",
            "check the spelling; for a private model give Hone a token (`hone models login`)",
            "hub-not-found",
        ) from None
    except errors.EntryNotFoundError as e:
        raise HubError(
            f"a file of {repo_id} is listed but cannot be downloaded ({e})",
            "try again later; the model may be changing on the Hub right now",
            "hub-file",
        ) from None
    except errors.OfflineModeIsEnabled:
        check_online()
        raise unreachable("offline mode is on") from None
    except errors.HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", 0)
        if status == 401 and repo_id:
            raise HubError(
                f"the Hugging Face Hub refused access to {repo_id} (401)",
                "for a private or gated model give Hone a token that can read it (`hone models login`)",
                "hub-gated",
            ) from None
        if status in (429,) or status >= 500:
            raise HubError(
                f"the Hugging Face Hub is not answering requests right now ({status})",
                "wait a minute and try again",
                "hub-server",
            ) from None
        raise
    except Exception as e:
        if is_connection_problem(e):
            raise unreachable(type(e).__name__) from None
        raise


def is_connection_problem(error: BaseException) -> bool:
    """A network failure from whichever HTTP client this huggingface_hub uses (httpx and its forks name the same
    classes), or from the operating system."""
    names = {cls.__name__ for cls in type(error).__mro__}
    return bool(
        names
        & {
            "ConnectError",
            "ConnectTimeout",
            "TimeoutException",
            "NetworkError",
            "ProxyError",
            "RemoteProtocolError",
            "ConnectionError",
            "TimeoutError",
            "URLError",
        }
    )
