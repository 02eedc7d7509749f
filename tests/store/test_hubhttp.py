"""The Hub's HTTP library is whichever huggingface_hub's own client uses (httpx on 1.x, httpx2 on 2.x); the
commands on 1.x run in tests/compat."""

from __future__ import annotations


def test_the_hub_client_library_is_the_one_huggingface_hub_uses():
    from huggingface_hub.utils import get_session

    from baton.store import hubhttp

    lib = hubhttp.client_library()
    assert isinstance(get_session(), lib.Client)
    assert lib.TransportError in hubhttp.transport_errors()
    assert isinstance(hubhttp.timeout(30.0), lib.Timeout)
