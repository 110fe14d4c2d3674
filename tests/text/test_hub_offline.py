"""A hub source where the hub cannot be reached fails at once, naming the mirror recipe."""

from __future__ import annotations

import socket
import time

import pytest
from support import hang_guard

from hpcllm.text import sources
from hpcllm.text.sources import SourceError, shard_documents

FINEWEB = {"type": "hub", "dataset": "HuggingFaceFW/fineweb", "name": "sample-10BT"}
OSCAR = {"type": "hub", "dataset": "oscar-corpus/OSCAR-2301", "name": "de"}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def hub_down(monkeypatch):
    """The hub endpoint is a closed port on this machine (connection refused), online mode."""
    from huggingface_hub import constants

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HPCLLM_HF_MIRROR"):
        monkeypatch.delenv(var, raising=False)
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{closed_port()}")


def assert_names_the_mirror(message: str, repo: str) -> None:
    assert "cannot reach the Hugging Face hub" in message
    assert f"hf download {repo} --repo-type dataset" in message
    assert f"mirror: <dir>/{repo}" in message and "HPCLLM_HF_MIRROR=<dir>" in message


@pytest.mark.parametrize("cfg", [FINEWEB, OSCAR], ids=["datasets", "files"])
def test_an_unreachable_hub_fails_at_once_naming_the_mirror(hub_down, cfg):
    start = time.monotonic()
    with pytest.raises(SourceError) as err:
        next(shard_documents("web", cfg, 0, 2))
    message = str(err.value)
    assert message.startswith("text.sources.web: ")
    assert "Connection refused" in message
    assert_names_the_mirror(message, cfg["dataset"])
    # Hang guard, not a speed assertion: expected well under a second on a quiet machine
    # (huggingface_hub's own retries would take about 35 s, far above the expected).
    assert time.monotonic() - start < hang_guard(1)


@pytest.mark.parametrize(
    "error",
    [
        ConnectionError(
            "Couldn't reach 'HuggingFaceFW/fineweb' on the Hub (LocalEntryNotFoundError)"
        ),
        pytest.param("LocalEntryNotFoundError", id="huggingface_hub"),
    ],
)
def test_a_connection_error_while_reading_names_the_mirror(hub_down, monkeypatch, error):
    """Past the up-front check (e.g. the connection drops later): the error the hub
    libraries raise is turned into the same message."""
    if error == "LocalEntryNotFoundError":
        from huggingface_hub.errors import LocalEntryNotFoundError

        error = LocalEntryNotFoundError("cannot find the requested files in the local cache")

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(sources, "check_hub_reachable", lambda *a, **k: None)
    monkeypatch.setattr(sources, "hub_dataset", fail)
    with pytest.raises(SourceError) as err:
        next(shard_documents("web", FINEWEB, 0, 2))
    assert type(error).__name__ in str(err.value)
    assert_names_the_mirror(str(err.value), FINEWEB["dataset"])


def test_other_errors_of_a_hub_source_are_not_taken_for_the_network(hub_down, monkeypatch):
    def fail(*args, **kwargs):
        raise ValueError("a bad config name")

    monkeypatch.setattr(sources, "check_hub_reachable", lambda *a, **k: None)
    monkeypatch.setattr(sources, "hub_dataset", fail)
    with pytest.raises(ValueError, match="^a bad config name$"):
        next(shard_documents("web", FINEWEB, 0, 2))
