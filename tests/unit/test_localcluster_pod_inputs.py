"""The local cluster's node agent reads a pod's configmaps, secrets and claims as the kubelet does:
the Node authorizer admits the read only once its graph holds the pod's binding, which trails the
binding itself. A 403 then must be a start the pod worker retries (PodStartError), not an exception
that ends the worker: in CI an actor pod bound to node-2 never started, and its deletion was never
confirmed, because the first read of its job configmap came back 403."""
import asyncio

import aiohttp
import pytest

from localcluster.api import ApiError
from localcluster.containers import PodStartError
from localcluster.nodeagent import NodeAgent


class Api:
    def __init__(self, *answers):
        self.answers, self.paths = list(answers), []

    async def get(self, path):
        self.paths.append(path)
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a


def agent(api) -> NodeAgent:
    a = NodeAgent.__new__(NodeAgent)  # only the API client matters to these reads
    a.api = api
    return a


@pytest.mark.parametrize("error", [
    ApiError(403, 'configmaps "job" is forbidden: node: no relationship found between node and this object'),
    ApiError(503, "the server is currently unable to handle the request"),
    aiohttp.ClientConnectionError("connection reset"),
    asyncio.TimeoutError()])
def test_a_refused_or_lost_read_is_a_start_to_retry(error):
    api = Api(error, {"data": {"job.yaml": "x"}})
    a = agent(api)
    with pytest.raises(PodStartError) as e:
        asyncio.run(a.read("configmaps", "ns", "job"))
    assert e.value.reason == "ContainerCreating" and "MountVolume.SetUp failed" in e.value.message
    assert asyncio.run(a.read("configmaps", "ns", "job")) == {"data": {"job.yaml": "x"}}  # the retry reads it
    assert api.paths == ["/api/v1/namespaces/ns/configmaps/job"] * 2


def test_not_found_stays_none_for_the_caller_to_judge():
    assert asyncio.run(agent(Api(None)).read("secrets", "ns", "keys")) is None  # optional volumes are fine
