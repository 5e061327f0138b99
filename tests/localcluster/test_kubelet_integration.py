"""The process kubelet against the real local control plane: pods run, exit, die and talk like real ones."""

from __future__ import annotations

import os
import socket
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from localcluster import Cluster
from localcluster.kubelet import find_log
from localcluster.podip import dns_ip, pod_ip
from localcluster.testing import container_exit_code, wait_for, wait_for_pod_gone, wait_for_pod_phase

pytestmark = pytest.mark.integration


def pod_manifest(name: str, script: str, *, node: str | None = None, env: list[dict] | None = None,
                 volumes: list[dict] | None = None, mounts: list[dict] | None = None, grace: int | None = None,
                 restart_policy: str = "Never", image: str = "ignored", **spec: object) -> dict:
    container: dict = {"name": "main", "image": image, "command": ["python", "-c", textwrap.dedent(script)],
                       "env": env or [], "volumeMounts": mounts or []}
    body: dict = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                  "spec": {"containers": [container], "restartPolicy": restart_policy, "volumes": volumes or [],
                           **spec}}
    if node:
        body["spec"]["nodeName"] = node
    if grace is not None:
        body["spec"]["terminationGracePeriodSeconds"] = grace
    return body


def host_dir(path: Path) -> tuple[list[dict], list[dict]]:
    """A hostPath volume ``out`` at /out (volumes, mounts): how a pod hands results back to the test."""
    return [{"name": "out", "hostPath": {"path": str(path), "type": "DirectoryOrCreate"}}], \
        [{"name": "out", "mountPath": "/out"}]


def wait_dead(pid: int, what: str, timeout: float = 10) -> None:
    def dead() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(dead, timeout, f"{what} (pid {pid}) to die")


@pytest.fixture
def core(api) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def test_pod_ip_addresses_bind_without_setup() -> None:
    ip = pod_ip({"metadata": {"name": "bind-check", "namespace": "x"}, "spec": {}})
    with socket.socket() as server:
        server.bind((ip, 0))
        server.listen()
        with socket.create_connection(server.getsockname(), timeout=5):
            conn, _ = server.accept()
            assert conn.getsockname()[0] == ip
            conn.close()


def test_exit_code_42_fails_the_pod_with_that_code(cluster: Cluster, core, namespace: str) -> None:
    """... and what the container left in its termination message file is the terminated state's message (a
    real kubelet's terminationMessagePath; the runtime finds the file through REPRIEVE_TERMINATION_LOG)."""
    body = pod_manifest("exit42", "import os, sys; print('hello from', os.environ['HOSTNAME']); "
                                  "open(os.environ['REPRIEVE_TERMINATION_LOG'], 'w').write('{\"peerLost\": [1]}'); "
                                  "sys.exit(42)")
    core.create_namespaced_pod(namespace, body)
    pod = wait_for_pod_phase(core.api_client, namespace, "exit42", "Failed", timeout=60)
    assert container_exit_code(pod) == 42
    term = pod.status.container_statuses[0].state.terminated
    assert term.reason == "Error" and term.finished_at is not None and term.message == '{"peerLost": [1]}'
    assert pod.status.pod_ip == pod_ip({"metadata": {"name": "exit42", "namespace": namespace}, "spec": {}},
                                      cluster.address_space)
    assert pod.status.host_ip == "127.0.0.1"
    log = cluster.workdir / "nodes" / pod.spec.node_name
    text = find_log(log, namespace, "exit42").read_text()
    assert "hello from exit42" in text


def test_deleted_pod_gets_sigterm_then_sigkill_after_grace(cluster: Cluster, core, namespace: str,
                                                           tmp_path: Path) -> None:
    volumes, mounts = host_dir(tmp_path)
    script = """
        import os, signal, time
        def on_term(*_):
            with open('/out/term', 'w') as f:
                f.write('TERM')
        signal.signal(signal.SIGTERM, on_term)   # record it, keep running: only SIGKILL ends us
        open('/out/pid', 'w').write(str(os.getpid()))
        while True:
            time.sleep(0.1)
    """
    # The script's /out paths are not rewritten (they are inside a -c program): it reads OUT instead.
    script = script.replace("'/out/", "os.environ['OUT'] + '/")
    env = [{"name": "OUT", "value": "/out"}]
    core.create_namespaced_pod(namespace, pod_manifest("victim", script, env=env, volumes=volumes, mounts=mounts,
                                                       grace=3))
    wait_for_pod_phase(core.api_client, namespace, "victim", "Running", timeout=60)
    pid = int(wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text(), 30, "pid file"))
    t0 = time.monotonic()
    core.delete_namespaced_pod("victim", namespace)
    wait_for_pod_gone(core.api_client, namespace, "victim", timeout=60)
    elapsed = time.monotonic() - t0
    assert (tmp_path / "term").read_text() == "TERM"
    # not before its grace, and well before the 30 s default: the pod's own 3 s grace was used
    assert 2.5 <= elapsed < 30, f"pod gone after {elapsed:.1f}s with a 3 s grace period"
    wait_dead(pid, "pod process after its grace period")  # killed by the kubelet, reaped asynchronously


def test_deleting_a_node_kills_its_pods(cluster: Cluster, core, namespace: str, tmp_path: Path) -> None:
    node = f"doomed-{uuid.uuid4().hex[:6]}"
    cluster.add_node(node)
    volumes, mounts = host_dir(tmp_path)
    script = "import os, time; open(os.environ['OUT'] + '/pid', 'w').write(str(os.getpid())); time.sleep(600)"
    env = [{"name": "OUT", "value": "/out"}]
    core.create_namespaced_pod(namespace, pod_manifest("on-doomed", script, node=node, env=env, volumes=volumes,
                                                       mounts=mounts))
    wait_for_pod_phase(core.api_client, namespace, "on-doomed", "Running", timeout=60)
    pid = int(wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text(), 30, "pid file"))
    os.kill(pid, 0)  # alive
    cluster.remove_node(node)
    wait_dead(pid, f"pod process of deleted node {node}")


def test_two_jobs_on_two_nodes_talk_over_tcp_by_headless_service_names_on_one_port(
        cluster: Cluster, core, namespace: str) -> None:
    nodes = cluster.node_names()
    assert len(nodes) >= 2, "needs two nodes"
    server = """
        import os, socket
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((os.environ['MY_IP'], 7000)); s.listen(); s.settimeout(60)
        conn, _ = s.accept(); msg = conn.recv(100); conn.sendall(b'pong:' + msg); conn.close()
        print('got', msg.decode(), flush=True)
    """
    client_script = """
        import os, socket, sys, time
        host, port = os.environ['PEER'].rsplit(':', 1)
        deadline = time.time() + 60
        while True:
            try:
                c = socket.create_connection((host, int(port)), timeout=5); break
            except OSError:
                if time.time() > deadline: raise
                time.sleep(0.2)
        c.sendall(os.environ['POD'].encode()); reply = c.recv(100).decode(); print(reply, flush=True)
        sys.exit(0 if reply == 'pong:' + os.environ['POD'] else 1)
    """
    ip_env = [{"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    jobs = ("ring-a", "ring-b")
    for job in jobs:  # both servers listen on port 7000, each on its own pod IP
        core.create_namespaced_service(namespace, {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": job},
            "spec": {"clusterIP": "None", "selector": {"job": job}, "ports": [{"port": 7000}]}})
        core.create_namespaced_pod(namespace, pod_manifest(
            f"{job}-0", server, node=nodes[0], env=ip_env, hostname=f"{job}-0", subdomain=job))
        core.create_namespaced_pod(namespace, pod_manifest(
            f"{job}-1", client_script, node=nodes[1], hostname=f"{job}-1", subdomain=job, env=[
                {"name": "PEER", "value": f"{job}-0.{job}.{namespace}.svc:7000"},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]))
    for job in jobs:
        for name in (f"{job}-0", f"{job}-1"):
            pod = wait_for_pod_phase(core.api_client, namespace, name, ["Succeeded", "Failed"], timeout=90)
            assert pod.status.phase == "Succeeded", f"{name}: {pod.status.container_statuses}"
        first = core.read_namespaced_pod(f"{job}-0", namespace)
        assert first.status.pod_ip == dns_ip(namespace, f"{job}-0", job, cluster.address_space)
        assert first.spec.node_name != core.read_namespaced_pod(f"{job}-1", namespace).spec.node_name


def _remove(core: Any, node: str, namespace: str, pod: str) -> None:
    """A test's own Node and its pod, gone at once (the pod's kubelet is stopped)."""
    core.delete_node(node)
    core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)


def test_in_process_kubelet_start_pids_stop(cluster: Cluster, core, namespace: str, tmp_path: Path) -> None:
    from localcluster.kubelet import Kubelet

    node = f"inproc-{uuid.uuid4().hex[:6]}"
    kubelet = Kubelet(cluster.api_client(), node, tmp_path / node, labels={"example.com/pool": "p"},
                      capacity={"cpu": "2"}, ca_file=cluster.pki.ca_crt)
    kubelet.start()
    try:
        got = core.read_node(node)
        assert got.metadata.labels["example.com/pool"] == "p" and got.status.capacity["cpu"] == "2"
        core.create_namespaced_pod(namespace, pod_manifest("inproc", "import time; time.sleep(600)", node=node))
        wait_for_pod_phase(core.api_client, namespace, "inproc", "Running", timeout=60)
        pids = kubelet.pids()
        assert list(pids) == [f"{namespace}/inproc/main"]
        pid = pids[f"{namespace}/inproc/main"]
        kubelet.stop()
        wait_dead(pid, "pod process of the stopped kubelet", timeout=5)
        assert core.read_node(node).metadata.name == node  # stop() leaves the Node
        assert kubelet.log_path(namespace, "inproc") is not None
    finally:
        kubelet.stop()
        _remove(core, node, namespace, "inproc")


def test_downward_annotations_file_follows_annotation_patches(cluster: Cluster, core, namespace: str,
                                                              tmp_path: Path) -> None:
    volumes, mounts = host_dir(tmp_path)
    volumes.append({"name": "podinfo", "downwardAPI": {"items": [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}})
    mounts.append({"name": "podinfo", "mountPath": "/etc/podinfo"})
    script = """
        import os, time
        path = os.environ['NOTICE_FILE']
        deadline = time.time() + 60
        while time.time() < deadline:
            text = open(path).read()
            if 'reprieve.dev/notice=' in text:
                open(os.environ['OUT'] + '/seen', 'w').write(text); break
            time.sleep(0.1)
        else:
            raise SystemExit('no notice: ' + text)
    """
    env = [{"name": "NOTICE_FILE", "value": "/etc/podinfo/annotations"}, {"name": "OUT", "value": "/out"}]
    core.create_namespaced_pod(namespace, pod_manifest("notice", script, env=env, volumes=volumes, mounts=mounts))
    wait_for_pod_phase(core.api_client, namespace, "notice", "Running", timeout=60)
    notice = '{"id": "x", "deadline": "2026-11-22T03:15:30Z"}'
    core.patch_namespaced_pod("notice", namespace, {"metadata": {"annotations": {"reprieve.dev/notice": notice}}})
    pod = wait_for_pod_phase(core.api_client, namespace, "notice", ["Succeeded", "Failed"], timeout=60)
    assert pod.status.phase == "Succeeded", pod.status.container_statuses
    assert (tmp_path / "seen").read_text() == \
        'reprieve.dev/notice="{\\"id\\": \\"x\\", \\"deadline\\": \\"2026-11-22T03:15:30Z\\"}"'


def test_service_account_token_mount_works_against_the_apiserver(cluster: Cluster, core, namespace: str) -> None:
    cluster.kubectl("create", "role", "pod-reader", "--verb=get,list", "--resource=pods", "-n", namespace)
    cluster.kubectl("create", "rolebinding", "default-reads", "--role=pod-reader",
                    f"--serviceaccount={namespace}:default", "-n", namespace)
    wait_for(lambda: core.read_namespaced_service_account("default", namespace), 30, "ServiceAccount default")
    script = """
        import json, os, ssl, sys, urllib.request, urllib.error
        d = os.environ['SA_DIR']
        token, ns = open(d + '/token').read(), open(d + '/namespace').read()
        ctx = ssl.create_default_context(cafile=d + '/ca.crt')
        base = 'https://%s:%s' % (os.environ['KUBERNETES_SERVICE_HOST'], os.environ['KUBERNETES_SERVICE_PORT'])
        def get(path):
            req = urllib.request.Request(base + path, headers={'Authorization': 'Bearer ' + token})
            try:
                return urllib.request.urlopen(req, context=ctx, timeout=10).status
            except urllib.error.HTTPError as e:
                return e.code
        codes = [get('/api/v1/namespaces/%s/pods' % ns), get('/api/v1/namespaces/kube-system/pods')]
        print(codes, flush=True)
        sys.exit(0 if codes == [200, 403] else 1)
    """
    env = [{"name": "SA_DIR", "value": "/var/run/secrets/kubernetes.io/serviceaccount"}]
    core.create_namespaced_pod(namespace, pod_manifest("sa-user", script, env=env))
    pod = wait_for_pod_phase(core.api_client, namespace, "sa-user", ["Succeeded", "Failed"], timeout=60)
    log = find_log(cluster.workdir / "nodes" / pod.spec.node_name, namespace, "sa-user")
    assert pod.status.phase == "Succeeded", log.read_text() if log else "no log"


def test_on_failure_pod_is_restarted_until_it_succeeds(cluster: Cluster, core, namespace: str,
                                                       tmp_path: Path) -> None:
    volumes, mounts = host_dir(tmp_path)
    script = """
        import os, sys
        marker = os.environ['OUT'] + '/tried'
        if not os.path.exists(marker):
            open(marker, 'w').close(); sys.exit(3)
    """
    env = [{"name": "OUT", "value": "/out"}]
    core.create_namespaced_pod(namespace, pod_manifest("flaky", script, env=env, volumes=volumes, mounts=mounts,
                                                       restart_policy="OnFailure"))
    pod = wait_for_pod_phase(core.api_client, namespace, "flaky", ["Succeeded", "Failed"], timeout=60)
    status = pod.status.container_statuses[0]
    assert pod.status.phase == "Succeeded" and status.restart_count == 1
    assert status.last_state.terminated.exit_code == 3 and status.state.terminated.exit_code == 0


def test_missing_executable_and_missing_configmap(cluster: Cluster, core, namespace: str) -> None:
    body = pod_manifest("nocmd", "")
    body["spec"]["containers"][0]["command"] = ["no-such-binary-xyz"]
    core.create_namespaced_pod(namespace, body)
    env = [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "later", "key": "x"}}}]
    core.create_namespaced_pod(namespace, pod_manifest("needs-cm", "import os; assert os.environ['X'] == 'ok'",
                                                       env=env))
    pod = wait_for_pod_phase(core.api_client, namespace, "nocmd", "Failed", timeout=60)
    term = pod.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason) == (128, "StartError") and "no-such-binary-xyz" in term.message

    def waiting_reason() -> str | None:
        statuses = core.read_namespaced_pod("needs-cm", namespace).status.container_statuses or []
        return statuses[0].state.waiting.reason if statuses and statuses[0].state.waiting else None

    assert wait_for(waiting_reason, 30, "needs-cm to report its config error") == "CreateContainerConfigError"
    assert core.read_namespaced_pod("needs-cm", namespace).status.phase == "Pending"
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "later"}, "data": {"x": "ok"}})
    pod = wait_for_pod_phase(core.api_client, namespace, "needs-cm", ["Succeeded", "Failed"], timeout=60)
    assert pod.status.phase == "Succeeded"


def test_killed_kubelet_takes_its_pods_with_it(cluster: Cluster, core, namespace: str, tmp_path: Path) -> None:
    node = f"vanish-{uuid.uuid4().hex[:6]}"
    cluster.add_node(node)
    volumes, mounts = host_dir(tmp_path)
    script = "import os, time; open(os.environ['OUT'] + '/pid', 'w').write(str(os.getpid())); time.sleep(600)"
    core.create_namespaced_pod(namespace, pod_manifest("on-vanish", script, node=node, volumes=volumes,
                                                       mounts=mounts, env=[{"name": "OUT", "value": "/out"}]))
    pid = int(wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text(), 60, "pid file"))
    try:
        cluster.kill_node(node)
        wait_dead(pid, f"pod process of SIGKILLed kubelet {node}")
    finally:
        core.delete_node(node)


def test_heartbeats_keep_taints_and_labels_set_by_others(cluster: Cluster, core, tmp_path: Path) -> None:
    from localcluster.kubelet import Kubelet
    from localcluster.testing import cordon_node, label_node, taint_node

    coord = client.CoordinationV1Api(core.api_client)
    node = f"beat-{uuid.uuid4().hex[:6]}"
    kubelet = Kubelet(cluster.api_client(), node, tmp_path, heartbeat_period=1.0)
    kubelet.start()
    try:
        lease = coord.read_namespaced_lease(node, "kube-node-lease")
        assert lease.spec.holder_identity == node and lease.spec.lease_duration_seconds == 40
        assert lease.metadata.owner_references[0].kind == "Node"
        registered = next(c for c in core.read_node(node).status.conditions if c.type == "Ready")
        taint_node(core.api_client, node, "example.com/test", "x", "NoSchedule")
        label_node(core.api_client, node, {"example.com/test": "kept"})
        cordon_node(core.api_client, node)

        def heartbeat_after_registration() -> bool:
            ready = next(c for c in core.read_node(node).status.conditions if c.type == "Ready")
            return ready.last_heartbeat_time > registered.last_heartbeat_time

        wait_for(heartbeat_after_registration, 10, f"a Ready heartbeat of {node}")
        assert coord.read_namespaced_lease(node, "kube-node-lease").spec.renew_time > lease.spec.renew_time
        got = core.read_node(node)
        assert "example.com/test" in [t.key for t in got.spec.taints or []] and got.spec.unschedulable
        assert got.metadata.labels["example.com/test"] == "kept"
        ready = next(c for c in got.status.conditions if c.type == "Ready")
        assert ready.status == "True" and ready.last_transition_time == registered.last_transition_time
    finally:
        kubelet.stop()
        core.delete_node(node)

    def lease_gone() -> bool:
        try:
            coord.read_namespaced_lease(node, "kube-node-lease")
        except client.ApiException as e:
            return e.status == 404
        return False

    wait_for(lease_gone, 30, f"the garbage collector to delete the Lease owned by Node {node}")


def test_restarted_kubelet_reports_pods_it_lost_and_keeps_node_taints(cluster: Cluster, core, namespace: str,
                                                                      tmp_path: Path) -> None:
    from localcluster.kubelet import Kubelet
    from localcluster.testing import taint_node

    node = f"reboot-{uuid.uuid4().hex[:6]}"
    first = Kubelet(cluster.api_client(), node, tmp_path / "a")
    first.start()
    second = None
    try:
        taint_node(core.api_client, node, "example.com/keep", "x", "NoSchedule")
        core.create_namespaced_pod(namespace, pod_manifest("lost", "import time; time.sleep(600)", node=node))
        wait_for_pod_phase(core.api_client, namespace, "lost", "Running", timeout=60)
        first.stop()  # the pod's process dies with it; the API still says Running
        second = Kubelet(cluster.api_client(), node, tmp_path / "b")
        second.start()
        pod = wait_for_pod_phase(core.api_client, namespace, "lost", "Failed", timeout=30)
        term = pod.status.container_statuses[0].state.terminated
        assert (term.exit_code, term.reason) == (137, "ContainerStatusUnknown")
        assert [t.key for t in core.read_node(node).spec.taints or []] == ["example.com/keep"]
        assert second.pids() == {}
    finally:
        first.stop()
        if second is not None:
            second.stop()
        _remove(core, node, namespace, "lost")


def test_init_containers_run_in_order_before_the_main_container(cluster: Cluster, core, namespace: str,
                                                                tmp_path: Path) -> None:
    volumes, mounts = host_dir(tmp_path)
    volumes.append({"name": "scratch", "emptyDir": {}})
    mounts.append({"name": "scratch", "mountPath": "/scratch"})
    env = [{"name": "OUT", "value": "/out"}, {"name": "SCRATCH", "value": "/scratch"}]
    step = "import os; open(os.environ['SCRATCH'] + '/order', 'a').write('{}\\n')"
    body = pod_manifest("with-init", "import os, shutil; shutil.copy(os.environ['SCRATCH'] + '/order', "
                                     "os.environ['OUT'] + '/order')", env=env, volumes=volumes, mounts=mounts)
    main = body["spec"]["containers"][0]
    body["spec"]["initContainers"] = [
        {**main, "name": "first", "command": ["python", "-c", step.format("first")]},
        {**main, "name": "second", "command": ["python", "-c", step.format("second")]},
    ]
    core.create_namespaced_pod(namespace, body)
    pod = wait_for_pod_phase(core.api_client, namespace, "with-init", ["Succeeded", "Failed"], timeout=60)
    assert pod.status.phase == "Succeeded", pod.status
    assert (tmp_path / "order").read_text() == "first\nsecond\n"
    assert [s.state.terminated.exit_code for s in pod.status.init_container_statuses] == [0, 0]

    failing = pod_manifest("init-fails", "print('must not run')")
    failing["spec"]["initContainers"] = [{"name": "boom", "image": "x", "command": ["python", "-c", "exit(7)"]}]
    core.create_namespaced_pod(namespace, failing)
    pod = wait_for_pod_phase(core.api_client, namespace, "init-fails", "Failed", timeout=60)
    assert pod.status.init_container_statuses[0].state.terminated.exit_code == 7
    assert pod.status.container_statuses[0].state.waiting.reason == "PodInitializing"


JAX_WORKER = """
    import os, jax
    from jax._src import distributed
    ip, index = os.environ['MY_IP'], int(os.environ['INDEX'])
    jax.distributed.initialize(coordinator_address=os.environ['COORD'], num_processes=2, process_id=index,
                               coordinator_bind_address=ip + ':8476', initialization_timeout=60,
                               # KUBERNETES_SERVICE_HOST is set: without this JAX tries in-cluster config at
                               # the hard-coded /var/run/secrets/... path, which a process pod does not have
                               cluster_detection_method='deactivate')
    kv = distributed.global_state.client
    kv.key_value_set(f'hello/{index}', os.environ['JOB'])
    other = kv.blocking_key_value_get(f'hello/{1 - index}', 60_000)
    print('process', jax.process_index(), 'of', jax.process_count(), 'peer says', other, flush=True)
    assert jax.process_count() == 2 and other == os.environ['JOB'], other
    jax.distributed.shutdown()
"""


def test_two_jax_jobs_share_a_coordinator_port_across_nodes(cluster: Cluster, core, namespace: str) -> None:
    nodes = cluster.node_names()
    jobs = ("jx-a", "jx-b")
    for job in jobs:
        for index in (0, 1):
            env = [{"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                   {"name": "INDEX", "value": str(index)}, {"name": "JOB", "value": job},
                   {"name": "JAX_PLATFORMS", "value": "cpu"},
                   {"name": "COORD", "value": f"{job}-0.{job}.{namespace}.svc:8476"}]
            core.create_namespaced_pod(namespace, pod_manifest(
                f"{job}-{index}", JAX_WORKER, node=nodes[index], env=env, hostname=f"{job}-{index}", subdomain=job))
    for job in jobs:
        for index in (0, 1):
            name = f"{job}-{index}"
            pod = wait_for_pod_phase(core.api_client, namespace, name, ["Succeeded", "Failed"], timeout=120)
            log = find_log(cluster.workdir / "nodes" / pod.spec.node_name, namespace, name)
            text = log.read_text() if log else "no log"
            assert pod.status.phase == "Succeeded", f"{name}:\n{text[-3000:]}"
            assert f"peer says {job}" in text


def test_status_patch_never_lands_on_a_namesake_pod(cluster: Cluster, core, namespace: str) -> None:
    from localcluster.podio import patch_pod_status

    body = pod_manifest("namesake", "pass", nodeSelector={"example.com/nowhere": "true"})  # stays unscheduled
    created = core.create_namespaced_pod(namespace, body)
    pod = {"metadata": {"name": "namesake", "namespace": namespace, "uid": "00000000-dead-beef-0000-000000000000"}}
    assert not patch_pod_status(core, pod, {"phase": "Failed"})
    assert core.read_namespaced_pod("namesake", namespace).status.phase == "Pending"
    pod["metadata"]["uid"] = created.metadata.uid
    assert patch_pod_status(core, pod, {"phase": "Failed"})
    assert core.read_namespaced_pod("namesake", namespace).status.phase == "Failed"


def test_second_delete_shortens_the_grace_period(cluster: Cluster, core, namespace: str) -> None:
    script = ("import signal, time; signal.signal(signal.SIGTERM, lambda *_: print('TERM', flush=True)); "
              "print('ready', flush=True); time.sleep(600)")
    core.create_namespaced_pod(namespace, pod_manifest("stubborn", script, grace=60))
    wait_for_pod_phase(core.api_client, namespace, "stubborn", "Running", timeout=60)
    # Running means started, not that the handler is in place yet (a loaded machine starts Python slowly)
    wait_for(lambda: any("ready" in p.read_text() for p in cluster.pod_logs(namespace, "stubborn", "main")), 60,
             "the pod's SIGTERM handler to be installed")
    core.delete_namespaced_pod("stubborn", namespace)
    # the kubelet acted on the first delete (SIGTERM, a 60 s grace running) before the second one comes
    wait_for(lambda: any("TERM" in p.read_text() for p in cluster.pod_logs(namespace, "stubborn", "main")), 60,
             "the first delete's SIGTERM")
    t0 = time.monotonic()
    core.delete_namespaced_pod("stubborn", namespace, grace_period_seconds=1)
    wait_for_pod_gone(core.api_client, namespace, "stubborn", timeout=45)
    elapsed = time.monotonic() - t0
    assert elapsed < 60 / 2, f"gone {elapsed:.1f}s after the 1 s delete: the 60 s grace was not shortened"


def test_emulated_image_pull_once_per_node_and_image_and_container_start(cluster: Cluster, core,
                                                                         namespace: str) -> None:
    """A node with emulated costs: the first pod of an image waits pull + start (ContainerCreating, Pulling and
    Pulled Events); the next pod of the same image on that node waits only the container start."""
    from localcluster.costs import EmulatedCosts

    pull_seconds = 4
    node = cluster.add_node(f"costly-{uuid.uuid4().hex[:6]}",
                            costs=EmulatedCosts(pull_seconds=pull_seconds, start_seconds=1))
    try:
        script = "import time; time.sleep(60)"
        starts = {}

        def creating(name: str) -> bool:
            pod = core.read_namespaced_pod(name, namespace)
            statuses = pod.status.container_statuses or []
            waiting = statuses[0].state.waiting if statuses else None
            return pod.status.phase == "Pending" and waiting is not None and waiting.reason == "ContainerCreating"

        for name in ("first", "second"):
            t0 = time.monotonic()
            core.create_namespaced_pod(namespace, pod_manifest(name, script, node=node, image="repo/trainer:1"))
            if name == "first":  # seen waiting in ContainerCreating (the pull), not yet Running
                wait_for(lambda: creating("first"), 30, "the first pod in ContainerCreating", interval=0.05)
            wait_for_pod_phase(core.api_client, namespace, name, "Running", timeout=60)
            starts[name] = time.monotonic() - t0
        assert starts["first"] >= pull_seconds + 1, starts  # 4 s pull + 1 s start (the emulation's timers)
        assert starts["second"] >= 1, starts  # the container start
        # pulled already: the second pod skips the pull, the one difference between the two (a second pull would
        # leave them about equal; half the pull leaves room for the kubelet's own latency)
        assert starts["first"] - starts["second"] >= pull_seconds / 2, starts
        reasons = wait_for(lambda: (r := [e.reason for e in core.list_namespaced_event(namespace).items
                                          if e.involved_object.name == "first"]) and "Pulled" in r and r, 10,
                           "the Pulled Event")
        assert "Pulling" in reasons
        assert not [e for e in core.list_namespaced_event(namespace).items
                    if e.involved_object.name == "second" and e.reason == "Pulling"]
    finally:
        cluster.remove_node(node)


def test_emulated_costs_refuse_negative_values() -> None:
    from localcluster.costs import EmulatedCosts

    with pytest.raises(ValueError, match="must be >= 0 seconds"):
        EmulatedCosts(pull_seconds=-1)
    assert EmulatedCosts.from_env(env={"REPRIEVE_EMULATE_PULL_SECONDS": "20"}).pull_seconds == 20
    assert "image pull 20 s" in EmulatedCosts(20, 1).describe()
