"""`pid submit` asks the engine's socket whether the sandbox image is there, without the Docker SDK; only a yes
is trusted (anything else goes to the SDK, which words the error). Real engine."""
from __future__ import annotations

import pytest

from pid.sandbox.engine_probe import image_present
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker


def test_an_image_that_is_there_is_found_without_the_sdk(monkeypatch):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert image_present(IMAGE) is True


@pytest.mark.parametrize("host", [None, "tcp://127.0.0.1:1", "unix:///nonexistent/docker.sock"])
def test_anything_but_a_yes_leaves_the_answer_to_the_sdk(monkeypatch, host):
    if host:
        monkeypatch.setenv("DOCKER_HOST", host)
        assert image_present(IMAGE) is None
    else:
        monkeypatch.delenv("DOCKER_HOST", raising=False)
        assert image_present("pid-no-such-image:latest") is None
        assert image_present("../../containers/json?x=") is None
