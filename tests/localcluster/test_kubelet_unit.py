"""Pure parts of the process kubelet: pod IPs, DNS rewriting, env, volumes, downward API, status."""

from __future__ import annotations

import base64
import ipaddress
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from localcluster.downward import FieldRefError, field_value, format_map, go_quote
from localcluster.nodespec import lease_object, node_object
from localcluster.podip import dns_ip, pod_ip, rewrite_dns
from localcluster.podspec import (
    EnvContext,
    PodConfigError,
    PodPaths,
    container_env,
    expand,
    launch_plan,
    mounts_for,
    referenced_objects,
    rewrite_paths,
    token_requests,
    volume_files,
)
from localcluster.podstatus import (
    ContainerFacts,
    container_status,
    init_progress,
    pod_phase,
    pod_status,
    restart_delay,
    should_restart,
)

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 22, 3, 0, 0, tzinfo=UTC)


def make_pod(name="j-0", ns="ns1", *, hostname=None, subdomain=None, containers=None, volumes=None,
             annotations=None, labels=None, restart_policy="Never", uid="0123abcd-0000-0000-0000-000000000000"):
    spec = {"containers": containers or [{"name": "main", "command": ["python", "-c", "pass"]}],
            "restartPolicy": restart_policy, "nodeName": "node-a", "serviceAccountName": "sa1"}
    if hostname:
        spec["hostname"] = hostname
    if subdomain:
        spec["subdomain"] = subdomain
    if volumes:
        spec["volumes"] = volumes
    return {"metadata": {"name": name, "namespace": ns, "uid": uid, "labels": labels or {},
                         "annotations": annotations or {}, "resourceVersion": "7"},
            "spec": spec, "status": {}}


def ctx(**kw):
    base = {"node_name": "node-a", "pod_ip": "127.9.9.9", "api_host": "127.0.0.1", "api_port": 6443,
            "parent_env": {"PATH": "/usr/bin", "HOME": "/root", "SECRET_PARENT": "x", "XLA_FLAGS": "--f"}}
    base.update(kw)
    return EnvContext(**base)


# --- pod IPs ---------------------------------------------------------------------------------------------------

def test_pod_ip_is_a_stable_loopback_address_away_from_edges():
    seen = set()
    for i in range(2000):
        ip = pod_ip(make_pod(name=f"p-{i}"))
        assert ip == pod_ip(make_pod(name=f"p-{i}"))
        addr = ipaddress.ip_address(ip)
        assert addr.is_loopback and ip != "127.0.0.1"
        assert all(1 <= int(o) <= 254 for o in ip.split(".")[1:])
        seen.add(ip)
    assert len(seen) > 1990  # a hash, not a constant


def test_pod_ip_of_hostname_subdomain_pod_is_its_dns_name_ip():
    pod = make_pod(name="whatever", hostname="j-0", subdomain="j")
    assert pod_ip(pod) == dns_ip("ns1", "j-0", "j")
    assert pod_ip(pod) != pod_ip(make_pod(name="whatever"))
    assert dns_ip("ns1", "j-0", "j") != dns_ip("ns2", "j-0", "j")
    host = make_pod(hostname="j-0", subdomain="j")
    host["spec"]["hostNetwork"] = True
    assert pod_ip(host) == "127.0.0.1"


IP = dns_ip("ns1", "j-0", "j")


@pytest.mark.parametrize("value, subdomains, expected", [
    ("j-0.j.ns1.svc.cluster.local:1234", (), f"{IP}:1234"),
    ("j-0.j.ns1.svc:1234", (), f"{IP}:1234"),
    ("http://j-0.j.ns1.svc/x", (), f"http://{IP}/x"),
    ("j-0.j.ns1:1234", ("j",), f"{IP}:1234"),
    ("j-0.j:1234", ("j",), f"{IP}:1234"),
    ("a=j-0.j,b=j-0.j.ns1.svc", ("j",), f"a={IP},b={IP}"),
    ("j-0.j.ns2.svc", (), dns_ip("ns2", "j-0", "j")),
    # short forms need a known subdomain, and the 3-label form the pod's own namespace
    ("j-0.j:1234", (), "j-0.j:1234"),
    ("j-0.j.ns2:1234", ("j",), "j-0.j.ns2:1234"),
    ("train.py", ("j",), "train.py"),
    ("example.com", ("j",), "example.com"),
    # no partial matches inside longer names
    ("x.j-0.j.ns1.svc", (), "x.j-0.j.ns1.svc"),
    ("j-0.j.ns1.svc.example", (), "j-0.j.ns1.svc.example"),
    ("J-0.J.NS1.SVC", (), "J-0.J.NS1.SVC"),
    ("no names here", ("j",), "no names here"),
])
def test_rewrite_dns(value, subdomains, expected):
    assert rewrite_dns(value, "ns1", subdomains) == expected


# --- downward API ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, quoted", [
    ("plain", '"plain"'),
    ('{"id": "x"}', r'"{\"id\": \"x\"}"'),
    ("a\\b", r'"a\\b"'),
    ("line1\nline2\t\r", r'"line1\nline2\t\r"'),
    ("\x00\x1b\x7f", r'"\x00\x1b\x7f"'),
    ("héllo ✓", '"héllo ✓"'),
    ("\u200b\u2028", r'"\u200b\u2028"'),
    ("\U000e0001", r'"\U000e0001"'),
    ("", '""'),
])
def test_go_quote_matches_strconv_quote(value, quoted):
    assert go_quote(value) == quoted


def test_format_map_is_sorted_key_quoted_value_lines_without_trailing_newline():
    text = format_map({"reprieve.dev/notice": '{"deadline": "2026-11-22T03:15:30Z"}', "a": "1"})
    assert text == 'a="1"\nreprieve.dev/notice="{\\"deadline\\": \\"2026-11-22T03:15:30Z\\"}"'
    assert format_map({}) == "" and format_map(None) == ""


@pytest.mark.parametrize("path, expected", [
    ("metadata.name", "j-0"),
    ("metadata.namespace", "ns1"),
    ("metadata.uid", "0123abcd-0000-0000-0000-000000000000"),
    ("metadata.labels['app']", "x"),
    ("metadata.labels['missing']", ""),
    ("metadata.annotations['note']", "hi"),
    ("metadata.labels", 'app="x"'),
    ("status.podIP", "127.9.9.9"),
    ("spec.nodeName", "node-a"),
    ("spec.serviceAccountName", "sa1"),
    ("status.hostIP", "127.0.0.1"),
])
def test_field_value(path, expected):
    pod = make_pod(labels={"app": "x"}, annotations={"note": "hi"})
    assert field_value(pod, path, pod_ip="127.9.9.9", node_name="node-a") == expected


def test_field_value_rejects_unknown_path_naming_pod_and_path():
    with pytest.raises(FieldRefError, match=r"ns1/j-0.*'status.phase'"):
        field_value(make_pod(), "status.phase", pod_ip="127.9.9.9", node_name="node-a")


# --- env ---------------------------------------------------------------------------------------------------------

def test_container_env_resolves_literals_fieldrefs_refs_and_passthrough(tmp_path):
    container = {"name": "main", "command": ["python"], "env": [
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "ATTEMPT", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['attempt']"}}},
        {"name": "COORD", "value": "j-0.j.ns1.svc:8476"},
        {"name": "NOTICE", "value": "/etc/reprieve/annotations"},
        {"name": "CKPT", "value": "file:///ckpt/run"},
        {"name": "REF", "value": "$(POD)-$(UNDEFINED)-$$(POD)"},
        {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
        {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "x", "optional": True}}},
        {"name": "XLA_FLAGS", "value": "--pod-wins"},
    ], "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "volumeMounts": [{"name": "notice", "mountPath": "/etc/reprieve"}, {"name": "ckpt", "mountPath": "/ckpt"}]}
    volumes = [{"name": "notice", "downwardAPI": {"items": []}},
               {"name": "ckpt", "hostPath": {"path": str(tmp_path / "shared")}}]
    pod = make_pod(labels={"attempt": "3"}, containers=[container], volumes=volumes)
    paths = PodPaths.of(tmp_path, "ns1", "j-0", pod["metadata"]["uid"])
    objects = {("ConfigMap", "cm"): {"k": "v", "other": "o"}, ("Secret", "s"): {"pw": "hunter2"}}
    env = container_env(pod, container, ctx(), objects, mounts_for(pod, container, paths))
    assert env["POD"] == "j-0" and env["IP"] == "127.9.9.9" and env["ATTEMPT"] == "3"
    assert env["COORD"] == f"{IP}:8476"
    assert env["NOTICE"] == str(paths.root / "etc/reprieve/annotations")
    assert env["CKPT"] == f"file://{tmp_path}/shared/run"  # hostPath: the host path itself
    assert env["REF"] == "j-0-$(UNDEFINED)-$(POD)"
    assert env["FROM_CM"] == "v" and env["FROM_SECRET"] == "hunter2" and "OPT" not in env
    assert env["CM_k"] == "v" and env["CM_other"] == "o"
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1" and env["KUBERNETES_SERVICE_PORT"] == "6443"
    assert env["PATH"] == "/usr/bin" and env["HOME"] == "/root" and "SECRET_PARENT" not in env
    assert env["XLA_FLAGS"] == "--pod-wins"
    assert env["HOSTNAME"] == "j-0"


def test_container_env_missing_key_is_a_config_error_naming_the_object():
    container = {"name": "main", "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]}
    with pytest.raises(PodConfigError, match=r"ns1/j-0.*env X.*'k'.*ConfigMap 'cm'.*missing"):
        container_env(make_pod(containers=[container]), container, ctx(), {}, [])
    with pytest.raises(PodConfigError, match=r"has keys \['other'\]"):
        container_env(make_pod(containers=[container]), container, ctx(), {("ConfigMap", "cm"): {"other": "1"}}, [])


@pytest.mark.parametrize("value, expected", [
    ("$(A)", "1"), ("$(A)$(B)", "12"), ("$$(A)", "$(A)"), ("$(C)", "$(C)"), ("$", "$"), ("a$$b", "a$b"),
    ("$(A", "$(A"),
])
def test_expand(value, expected):
    assert expand(value, {"A": "1", "B": "2"}) == expected


def test_rewrite_paths_only_at_path_starts(tmp_path):
    container = {"name": "c", "volumeMounts": [{"name": "d", "mountPath": "/data"},
                                               {"name": "s", "mountPath": "/data/sub/"}]}
    pod = make_pod(containers=[container], volumes=[{"name": "d", "emptyDir": {}}, {"name": "s", "emptyDir": {}}])
    paths = PodPaths.of(tmp_path, "ns1", "j-0", "u" * 8)
    mounts = mounts_for(pod, container, paths)
    root = paths.root
    assert rewrite_paths("/data/x", mounts) == f"{root}/data/x"
    assert rewrite_paths("/data", mounts) == f"{root}/data"
    assert rewrite_paths("/data/sub/y", mounts) == f"{root}/data/sub/y"
    assert rewrite_paths("--dir=/data/x", mounts) == f"--dir={root}/data/x"
    assert rewrite_paths("/database", mounts) == "/database"
    assert rewrite_paths("x/data", mounts) == "x/data"


def test_rewrite_paths_is_one_pass_even_when_the_pod_root_starts_with_a_mount_path(tmp_path):
    root_parent = tmp_path.parts[1]  # e.g. "tmp": the pod root itself lies under /<root_parent>
    container = {"name": "c", "volumeMounts": [{"name": "a", "mountPath": f"/{root_parent}"},
                                               {"name": "b", "mountPath": f"/{root_parent}/b"}]}
    pod = make_pod(containers=[container], volumes=[{"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}}])
    paths = PodPaths.of(tmp_path, "ns1", "j-0", "u" * 8)
    mounts = mounts_for(pod, container, paths)
    assert rewrite_paths(f"/{root_parent}/b/x", mounts) == f"{paths.root}/{root_parent}/b/x"
    assert rewrite_paths(f"/{root_parent}/x", mounts) == f"{paths.root}/{root_parent}/x"


def test_launch_plan_argv_and_errors(tmp_path):
    c = {"name": "main", "command": ["python"], "args": ["-m", "train", "--coord=$(COORD)"],
         "env": [{"name": "COORD", "value": "j-1.j.ns1.svc:1"}]}
    pod = make_pod(containers=[c])
    paths = PodPaths.of(tmp_path, "ns1", "j-0", pod["metadata"]["uid"])
    plan = launch_plan(pod, c, paths, ctx(), {})
    assert plan.argv == ["python", "-m", "train", f"--coord={dns_ip('ns1', 'j-1', 'j')}:1"]
    assert plan.cwd == paths.root
    empty = {"name": "main", "image": "busybox"}
    with pytest.raises(PodConfigError, match="no command or args.*ignores images"):
        launch_plan(make_pod(containers=[empty]), empty, paths, ctx(), {})
    bad = {"name": "main", "command": ["x"], "volumeMounts": [{"name": "ghost", "mountPath": "/g"}]}
    with pytest.raises(PodConfigError, match="'ghost', which is not in spec.volumes"):
        launch_plan(make_pod(containers=[bad]), bad, paths, ctx(), {})


# --- volumes -----------------------------------------------------------------------------------------------------

SA_VOLUME = {"name": "kube-api-access-x", "projected": {"sources": [
    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                 "fieldPath": "metadata.namespace"}}]}},
]}}


def test_projected_service_account_volume_files():
    pod = make_pod(volumes=[SA_VOLUME])
    assert token_requests(pod) == {("", 3607)}
    assert ("ConfigMap", "kube-root-ca.crt") in referenced_objects(pod)
    files = volume_files(pod, SA_VOLUME, objects={}, tokens={("", 3607): "tok"}, pod_ip="127.1.1.1",
                         node_name="n", ca_pem="PEM")
    assert files == {"token": "tok", "ca.crt": "PEM", "namespace": "ns1"}
    files = volume_files(pod, SA_VOLUME, objects={("ConfigMap", "kube-root-ca.crt"): {"ca.crt": "FROM-CM"}},
                         tokens={("", 3607): "tok"}, pod_ip="127.1.1.1", node_name="n", ca_pem="PEM")
    assert files["ca.crt"] == "FROM-CM"


def test_downward_volume_follows_annotations():
    vol = {"name": "notice", "downwardAPI": {"items": [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}
    pod = make_pod(annotations={"reprieve.dev/notice": '{"id":"a"}'}, labels={"l": "1"}, volumes=[vol])
    files = volume_files(pod, vol, objects={}, tokens={}, pod_ip="127.1.1.1", node_name="n")
    assert files == {"annotations": 'reprieve.dev/notice="{\\"id\\":\\"a\\"}"', "labels": 'l="1"'}


@pytest.mark.parametrize("volume, match", [
    ({"name": "v", "persistentVolumeClaim": {"claimName": "c"}}, "type \\['persistentVolumeClaim'\\] is not supp"),
    ({"name": "v", "configMap": {"name": "absent"}}, "ConfigMap 'absent', which is missing"),
    ({"name": "v", "downwardAPI": {"items": [{"path": "cpu", "resourceFieldRef": {"resource": "limits.cpu"}}]}},
     "resourceFieldRef is not supported"),
])
def test_volume_errors(volume, match):
    with pytest.raises((PodConfigError, FieldRefError), match=match):
        volume_files(make_pod(volumes=[volume]), volume, objects={}, tokens={}, pod_ip="127.1.1.1", node_name="n")


def test_secret_volume_items_and_optional():
    vol = {"name": "v", "secret": {"secretName": "s", "items": [{"key": "a", "path": "dir/a.txt"}]}}
    assert volume_files(make_pod(), vol, objects={("Secret", "s"): {"a": "1", "b": "2"}}, tokens={},
                        pod_ip="127.1.1.1", node_name="n") == {"dir/a.txt": "1"}
    opt = {"name": "v", "secret": {"secretName": "gone", "optional": True}}
    assert volume_files(make_pod(), opt, objects={}, tokens={}, pod_ip="1", node_name="n") == {}
    assert base64.b64decode(base64.b64encode(b"x")) == b"x"


# --- status ------------------------------------------------------------------------------------------------------

def facts(returncode=None, started=True, name="main"):
    return ContainerFacts(name=name, pid=100, started_at=T0 if started else None, returncode=returncode,
                          finished_at=None if returncode is None else T0 + timedelta(seconds=5))


@pytest.mark.parametrize("policy, codes, deleting, phase", [
    ("Never", [None], False, "Running"),
    ("Never", [0], False, "Succeeded"),
    ("Never", [42], False, "Failed"),
    ("Never", [0, None], False, "Running"),
    ("Never", [0, 1], False, "Failed"),
    ("OnFailure", [1], False, "Running"),
    ("OnFailure", [0], False, "Succeeded"),
    ("Always", [0], False, "Running"),
    ("Always", [-15], True, "Failed"),
    ("Always", [0], True, "Succeeded"),
])
def test_pod_phase(policy, codes, deleting, phase):
    assert pod_phase(policy, [facts(c, name=f"c{i}") for i, c in enumerate(codes)], deleting=deleting) == phase


@pytest.mark.parametrize("policy, init_codes, main_codes, phase", [
    ("Never", [None], [], "Pending"),            # first init container running, main not started
    ("Never", [0, None], [], "Pending"),
    ("Never", [0, 3], [], "Failed"),             # an init container failed: no retry under Never
    ("OnFailure", [3], [], "Pending"),           # ... retried otherwise
    ("Always", [3], [], "Pending"),
    ("Never", [0, 0], [None], "Running"),
    ("Never", [0], [0], "Succeeded"),
])
def test_pod_phase_with_init_containers(policy, init_codes, main_codes, phase):
    init = [facts(c, name=f"i{i}") for i, c in enumerate(init_codes)]
    main = [facts(c, name=f"c{i}") for i, c in enumerate(main_codes)] or [facts(started=False)]
    assert init_progress(policy, init) in ("done", "running", "failed")
    assert pod_phase(policy, main, init_facts=init) == phase


def test_init_container_status_and_initialized_condition():
    pod = make_pod(restart_policy="Never")
    waiting = [facts(started=False)]
    st = pod_status(pod, waiting, pod_ip="127.2.2.2", host_ip="127.0.0.1", start_time=T0, now=T0,
                    init_facts=[facts(0, name="init-a"), facts(None, name="init-b")])
    cond = {c["type"]: c for c in st["conditions"]}
    assert cond["Initialized"]["status"] == "False" and cond["Initialized"]["reason"] == "ContainersNotInitialized"
    assert [s["ready"] for s in st["initContainerStatuses"]] == [True, True]
    assert st["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert st["phase"] == "Pending"
    assert should_restart("OnFailure", facts(1), init=True) and should_restart("Always", facts(1), init=True)
    assert not should_restart("Always", facts(0), init=True) and not should_restart("Never", facts(1), init=True)


def test_pod_phase_pending_until_every_container_started():
    assert pod_phase("Never", [facts(started=False)]) == "Pending"
    assert pod_phase("Never", []) == "Pending"


@pytest.mark.parametrize("returncode, code, reason, signal", [
    (0, 0, "Completed", None), (42, 42, "Error", None), (-15, 143, "Error", 15), (-9, 137, "Error", 9),
])
def test_terminated_container_status(returncode, code, reason, signal):
    term = container_status(facts(returncode))["state"]["terminated"]
    assert term["exitCode"] == code and term["reason"] == reason and term.get("signal") == signal
    assert term["startedAt"] == "2026-11-22T03:00:00Z" and term["finishedAt"] == "2026-11-22T03:00:05Z"


def test_pod_status_running_then_failed_keeps_transition_times():
    pod = make_pod()
    running = pod_status(pod, [facts()], pod_ip="127.2.2.2", host_ip="127.0.0.1", start_time=T0, now=T0)
    assert running["phase"] == "Running" and running["podIP"] == "127.2.2.2"
    assert running["podIPs"] == [{"ip": "127.2.2.2"}] and running["hostIP"] == "127.0.0.1"
    cond = {c["type"]: c for c in running["conditions"]}
    assert cond["Ready"]["status"] == "True" and cond["Initialized"]["status"] == "True"
    cs = running["containerStatuses"][0]
    assert cs["ready"] and cs["state"] == {"running": {"startedAt": "2026-11-22T03:00:00Z"}}
    pod["status"] = running
    later = T0 + timedelta(seconds=9)
    failed = pod_status(pod, [facts(42)], pod_ip="127.2.2.2", host_ip="127.0.0.1", start_time=T0, now=later)
    cond = {c["type"]: c for c in failed["conditions"]}
    assert failed["phase"] == "Failed" and cond["Ready"]["status"] == "False"
    assert cond["Ready"]["reason"] == "PodFailed" and cond["Ready"]["lastTransitionTime"] == "2026-11-22T03:00:09Z"
    assert cond["ContainersReady"]["reason"] == "PodFailed" and "reason" not in cond["Initialized"]
    assert cond["Initialized"]["lastTransitionTime"] == "2026-11-22T03:00:00Z"
    assert failed["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 42
    json.dumps(failed)  # it is what gets sent


def test_terminal_pod_conditions_read_as_the_real_kubelets():
    """Measured on a real node (kubelet v1.35.4): Ready/ContainersReady say PodFailed or PodCompleted, a Succeeded
    pod's Initialized says PodCompleted, the order is PodReadyToStartContainers, Initialized, Ready,
    ContainersReady, and observedGeneration is reported."""
    pod = make_pod()
    pod["metadata"]["generation"] = 3
    done = pod_status(pod, [facts(0)], pod_ip="127.2.2.2", host_ip="127.0.0.1", start_time=T0, now=T0)
    assert done["phase"] == "Succeeded" and done["observedGeneration"] == 3
    assert [(c["type"], c["status"], c.get("reason")) for c in done["conditions"]] == [
        ("PodReadyToStartContainers", "False", None), ("Initialized", "True", "PodCompleted"),
        ("Ready", "False", "PodCompleted"), ("ContainersReady", "False", "PodCompleted")]


def test_restart_rules():
    assert should_restart("Always", facts(0)) and should_restart("OnFailure", facts(3))
    assert not should_restart("OnFailure", facts(0)) and not should_restart("Never", facts(3))
    assert not should_restart("Always", facts(None))
    assert [restart_delay(n) for n in range(6)] == [1, 2, 4, 8, 10, 10]


def test_waiting_status_carries_config_error():
    f = ContainerFacts(name="main", waiting_reason="CreateContainerConfigError", waiting_message="boom")
    assert container_status(f)["state"] == {"waiting": {"reason": "CreateContainerConfigError", "message": "boom"}}


# --- node --------------------------------------------------------------------------------------------------------

def test_node_object_and_lease():
    node = node_object("node-a", {"pool": "p"}, {"cpu": "4", "memory": "8Gi", "pods": "10"}, T0)
    labels = node["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == "node-a" and labels["pool"] == "p"
    st = node["status"]
    assert st["capacity"] == st["allocatable"] == {"cpu": "4", "memory": "8Gi", "pods": "10"}
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["lastHeartbeatTime"] == "2026-11-22T03:00:00Z"
    assert {"type": "InternalIP", "address": "127.0.0.1"} in st["addresses"]
    lease = lease_object("node-a", "uid-1", T0)
    assert lease["metadata"]["namespace"] == "kube-node-lease"
    assert lease["metadata"]["ownerReferences"][0] == {"apiVersion": "v1", "kind": "Node", "name": "node-a",
                                                       "uid": "uid-1"}
    assert lease["spec"]["renewTime"] == "2026-11-22T03:00:00.000000Z"


def test_pod_paths_layout(tmp_path: Path):
    paths = PodPaths.of(tmp_path, "ns1", "j-0", "0123abcd-ffff")
    assert paths.root_dir == tmp_path / "pods" / "ns1" / "j-0-0123abcd"
    assert paths.log("main") == paths.root_dir / "logs" / "main.log"
    assert paths.in_root("/var/run/secrets/kubernetes.io/serviceaccount") == \
        paths.root / "var/run/secrets/kubernetes.io/serviceaccount"
