"""The node agent's patience with a busy API server (cluster/localcluster/api.py `retrying`):
a node agent that gave up on one slow answer while registering never ran a pod."""
from __future__ import annotations

import asyncio
import logging

import pytest

from localcluster.api import ApiError, retrying

log = logging.getLogger("test")


def _answers(*outcomes):
    calls = []

    async def call():
        calls.append(1)
        out = outcomes[len(calls) - 1]
        if isinstance(out, BaseException):
            raise out
        return out
    return call, calls


async def test_timeouts_refusals_and_5xx_are_tried_again(monkeypatch):
    slept = []

    async def sleep(s):
        slept.append(s)
    monkeypatch.setattr(asyncio, "sleep", sleep)
    call, calls = _answers(asyncio.TimeoutError(), ConnectionRefusedError(), ApiError(503, "busy"),
                           ApiError(429, "slow down"), {"spec": {"podCIDR": "10.0.1.0/24"}})
    assert await retrying("reading the node", call, log, max_delay=1.0) == {"spec": {"podCIDR": "10.0.1.0/24"}}
    assert len(calls) == 5 and slept == [0.25, 0.5, 1.0, 1.0]  # doubling, capped


async def test_a_refusal_is_raised_at_once():
    call, calls = _answers(ApiError(403, "forbidden"), {})
    with pytest.raises(ApiError, match="forbidden"):
        await retrying("registering the node", call, log)
    assert len(calls) == 1
