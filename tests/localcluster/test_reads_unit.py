"""localcluster.reads.resource_path: the API path kubectl would GET for a kind, a name, a namespace, selectors."""

from __future__ import annotations

import pytest
from localcluster.reads import resource_path

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("args", "kwargs", "path"), [
    (("pod", "w-0", "ns"), {}, "/api/v1/namespaces/ns/pods/w-0"),
    (("pods", None, "ns"), {"selector": "reprieve.dev/job-name=lm"},
     "/api/v1/namespaces/ns/pods?labelSelector=reprieve.dev%2Fjob-name%3Dlm"),
    (("tj", "lm", "ns"), {}, "/apis/reprieve.dev/v1alpha1/namespaces/ns/trainingjobs/lm"),
    (("trainingjobs",), {}, "/apis/reprieve.dev/v1alpha1/trainingjobs"),  # every namespace: the CRD is served
    (("sa", "default", "team-a"), {}, "/api/v1/namespaces/team-a/serviceaccounts/default"),
    (("events", None, "ns"), {"field_selector": "involvedObject.name=lm"},
     "/api/v1/namespaces/ns/events?fieldSelector=involvedObject.name%3Dlm"),
    (("node", "real-w-0"), {}, "/api/v1/nodes/real-w-0"),
    (("node", "n", "ignored"), {}, "/api/v1/nodes/n"),  # cluster-scoped: a namespace does not enter the path
    (("lease", "reprieve", "reprieve-system"), {},
     "/apis/coordination.k8s.io/v1/namespaces/reprieve-system/leases/reprieve"),
    (("workload", "w", "ns"), {}, "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads/w"),
    (("clusterqueue", "cq", "ns"), {}, "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/cq"),
])
def test_resource_path(args: tuple, kwargs: dict, path: str) -> None:
    assert resource_path(*args, **kwargs) == path


@pytest.mark.parametrize(("args", "says"), [
    (("deployment", "d", "ns"), "unknown kind 'deployment'"),
    (("pod", "w-0"), "pod 'w-0' is namespaced: give its namespace"),
])
def test_bad_reads_say_what_is_wrong(args: tuple, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        resource_path(*args)
