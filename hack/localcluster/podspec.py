"""Translate a Pod into a local process launch plan (pure; the process kubelet does the I/O).

Layout of one pod on disk (``root`` is the pod's root directory, see ``PodPaths``)::

    <workdir>/pods/<namespace>/<name>-<uid[:8]>/
        logs/<container>.log      stdout + stderr of the container's process
        volumes/<volume>/         emptyDir / downwardAPI / configMap / secret / projected contents
        root/                     the container's view of "/": cwd, and root/<mountPath> -> the volume dir

Path mapping: a container ``volumeMount`` at P is ``root/P`` (a symlink to the volume's directory; for a
hostPath volume, to the host path itself). Env values and command/args that start with P (also after ``=`` or
``file://``) are rewritten to the local directory (for hostPath: the host path, so every pod sees the same
absolute path). Headless-service names are rewritten to pod IPs (``podip.rewrite_dns``).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from localcluster.downward import downward_files, field_value
from localcluster.podip import rewrite_dns

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Parent-environment variables a pod inherits (its "image environment"); the pod's own env overrides them.
PASSTHROUGH_ENV = (
    "PATH", "HOME", "PYTHONPATH", "VIRTUAL_ENV", "XLA_FLAGS", "JAX_PLATFORMS", "LANG", "LC_ALL", "TMPDIR",
)
Objects = Mapping[tuple[str, str], Mapping[str, str]]  # ("ConfigMap"|"Secret", name) -> decoded data


class PodConfigError(ValueError):
    """The pod cannot be started as written (the real kubelet's CreateContainerConfigError)."""


@dataclass(frozen=True)
class PodPaths:
    root_dir: Path  # <workdir>/pods/<ns>/<name>-<uid8>

    @classmethod
    def of(cls, workdir: Path, namespace: str, name: str, uid: str) -> PodPaths:
        return cls(Path(workdir) / "pods" / namespace / f"{name}-{uid[:8]}")

    @property
    def root(self) -> Path:
        return self.root_dir / "root"

    def log(self, container: str) -> Path:
        return self.root_dir / "logs" / f"{container}.log"

    def termination_log(self, container: str) -> Path:
        """The container's terminationMessagePath, as a host file (its path in REPRIEVE_TERMINATION_LOG)."""
        return self.root_dir / "termination" / f"{container}.log"

    def volume(self, name: str) -> Path:
        return self.root_dir / "volumes" / name

    def in_root(self, path: str) -> Path:
        return self.root / path.lstrip("/")


@dataclass(frozen=True)
class Mount:
    mount_path: str   # as written in the pod
    link: Path        # root/<mountPath>
    target: Path      # what it points at (volume dir, sub path, or host path)
    rewrite_to: Path  # what env/args starting with mount_path are rewritten to


@dataclass(frozen=True)
class LaunchPlan:
    container: str
    argv: list[str]   # argv[0] still to be resolved on env PATH
    env: dict[str, str]
    cwd: Path
    mounts: list[Mount] = field(default_factory=list)


def _pod_label(pod: dict) -> str:
    meta = pod.get("metadata") or {}
    return f"Pod {meta.get('namespace')}/{meta.get('name')}"


# --- $(VAR) expansion, as k8s.io/kubernetes/third_party/forked/golang/expansion ------------------------------

_EXPANSION = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known vars replaced, unknown left as written, ``$$`` -> ``$``."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _EXPANSION.sub(sub, value)


# --- mounts and path rewriting -------------------------------------------------------------------------------

def mounts_for(pod: dict, container: dict, paths: PodPaths) -> list[Mount]:
    """Local mapping of the container's volumeMounts, longest mount path first.

    Raises:
        PodConfigError: a mount names a volume the pod does not declare.
    """
    volumes = {v["name"]: v for v in (pod.get("spec") or {}).get("volumes") or []}
    mounts = []
    for vm in container.get("volumeMounts") or []:
        volume = volumes.get(vm.get("name"))
        if volume is None:
            raise PodConfigError(
                f"{_pod_label(pod)}: container {container.get('name')!r} volumeMount {vm.get('mountPath')!r} "
                f"names volume {vm.get('name')!r}, which is not in spec.volumes"
            )
        if "hostPath" in volume:
            base = Path(volume["hostPath"]["path"])
        else:
            base = paths.volume(volume["name"])
        target = base / vm["subPath"] if vm.get("subPath") else base
        rewrite_to = target if "hostPath" in volume else paths.in_root(vm["mountPath"])
        mounts.append(Mount(vm["mountPath"].rstrip("/") or "/", paths.in_root(vm["mountPath"]), target, rewrite_to))
    return sorted(mounts, key=lambda m: len(m.mount_path), reverse=True)


def rewrite_paths(value: str, mounts: list[Mount]) -> str:
    """``value`` with a leading mount path (also after ``=`` or ``file://``) mapped to its local directory."""
    targets = {m.mount_path: str(m.rewrite_to) for m in mounts if m.mount_path != "/"}
    if not targets:
        return value
    # One pass (a rewritten path may itself start with a mount path); longest first, so /data/sub wins.
    alternatives = "|".join(re.escape(p) for p in sorted(targets, key=len, reverse=True))
    pattern = r"(?:^|(?<==)|(?<=file://))(" + alternatives + r")(?=/|$|[\s:,;])"

    def sub(match: re.Match[str]) -> str:
        return targets[match.group(1)]

    return re.sub(pattern, sub, value)


# --- environment ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EnvContext:
    node_name: str
    pod_ip: str
    api_host: str
    api_port: int
    parent_env: Mapping[str, str]
    passthrough: Collection[str] = PASSTHROUGH_ENV
    subdomains: Collection[str] = ()
    host_ip: str = "127.0.0.1"
    address_space: str = ""  # the cluster's (podip.address_space)


def _key_ref(pod: dict, kind: str, ref: dict, objects: Objects, what: str) -> str | None:
    data = objects.get((kind, ref.get("name", "")))
    if data is not None and ref.get("key") in data:
        return data[ref["key"]]
    if ref.get("optional"):
        return None
    found = "missing" if data is None else f"has keys {sorted(data)}"
    raise PodConfigError(f"{_pod_label(pod)}: {what} needs key {ref.get('key')!r} of {kind} "
                         f"{ref.get('name')!r}, which is {found}")


def container_env(pod: dict, container: dict, ctx: EnvContext, objects: Objects,
                  mounts: list[Mount]) -> dict[str, str]:
    """The process environment: passthrough, then Kubernetes' service vars, envFrom and env (in that order).

    Raises:
        PodConfigError: a referenced ConfigMap/Secret key is missing (and not optional) or a fieldRef is
            unsupported.
    """
    spec = pod.get("spec") or {}
    env = {k: ctx.parent_env[k] for k in ctx.passthrough if k in ctx.parent_env}
    namespace = (pod.get("metadata") or {}).get("namespace", "default")
    pod_env = {
        "HOSTNAME": spec.get("hostname") or (pod.get("metadata") or {}).get("name", ""),
        "KUBERNETES_SERVICE_HOST": ctx.api_host,
        "KUBERNETES_SERVICE_PORT": str(ctx.api_port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(ctx.api_port),
    }

    def rewrite(value: str) -> str:
        return rewrite_paths(rewrite_dns(value, namespace, ctx.subdomains, ctx.address_space), mounts)

    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if key in source:
                ref = source[key]
                data = objects.get((kind, ref.get("name", "")))
                if data is None and not ref.get("optional"):
                    raise PodConfigError(f"{_pod_label(pod)}: envFrom needs {kind} {ref.get('name')!r}, "
                                         "which is missing")
                for k, v in (data or {}).items():
                    pod_env[prefix + k] = rewrite(v)
    for var in container.get("env") or []:
        name = var["name"]
        if "value" in var or "valueFrom" not in var:
            pod_env[name] = rewrite(expand(var.get("value", ""), pod_env))
            continue
        source = var["valueFrom"]
        what = f"env {name}"
        if "fieldRef" in source:
            value: str | None = field_value(pod, source["fieldRef"]["fieldPath"], pod_ip=ctx.pod_ip,
                                            node_name=ctx.node_name, host_ip=ctx.host_ip)
        elif "configMapKeyRef" in source:
            value = _key_ref(pod, "ConfigMap", source["configMapKeyRef"], objects, what)
        elif "secretKeyRef" in source:
            value = _key_ref(pod, "Secret", source["secretKeyRef"], objects, what)
        else:
            raise PodConfigError(f"{_pod_label(pod)}: {what}: valueFrom {sorted(source)} is not supported by "
                                 "the process kubelet (fieldRef, configMapKeyRef, secretKeyRef are)")
        if value is not None:
            pod_env[name] = rewrite(value)
    env.update(pod_env)
    return env


def referenced_objects(pod: dict) -> set[tuple[str, str]]:
    """Every ``(kind, name)`` ConfigMap/Secret the pod's env, envFrom and volumes read."""
    refs: set[tuple[str, str]] = set()
    spec = pod.get("spec") or {}
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        for source in c.get("envFrom") or []:
            if "configMapRef" in source:
                refs.add(("ConfigMap", source["configMapRef"].get("name", "")))
            if "secretRef" in source:
                refs.add(("Secret", source["secretRef"].get("name", "")))
        for var in c.get("env") or []:
            vf = var.get("valueFrom") or {}
            if "configMapKeyRef" in vf:
                refs.add(("ConfigMap", vf["configMapKeyRef"].get("name", "")))
            if "secretKeyRef" in vf:
                refs.add(("Secret", vf["secretKeyRef"].get("name", "")))
    for v in spec.get("volumes") or []:
        sources = [v] + list((v.get("projected") or {}).get("sources") or [])
        for s in sources:
            if "configMap" in s:
                refs.add(("ConfigMap", s["configMap"].get("name", "")))
            if "secret" in s:
                refs.add(("Secret", s["secret"].get("secretName") or s["secret"].get("name", "")))
    return refs


# --- volumes -------------------------------------------------------------------------------------------------

SUPPORTED_VOLUMES = ("emptyDir", "hostPath", "downwardAPI", "configMap", "secret", "projected")


def token_requests(pod: dict) -> set[tuple[str, int]]:
    """``(audience, expirationSeconds)`` of every projected serviceAccountToken source (audience "" = API)."""
    out = set()
    for v in (pod.get("spec") or {}).get("volumes") or []:
        for s in (v.get("projected") or {}).get("sources") or []:
            if "serviceAccountToken" in s:
                t = s["serviceAccountToken"]
                out.add((t.get("audience") or "", int(t.get("expirationSeconds") or 3600)))
    return out


def _object_files(pod: dict, kind: str, ref: dict, objects: Objects, ca_pem: str | None) -> dict[str, str]:
    name = ref.get("secretName") or ref.get("name", "")
    data = objects.get((kind, name))
    if data is None and kind == "ConfigMap" and name == "kube-root-ca.crt" and ca_pem is not None:
        data = {"ca.crt": ca_pem}  # root-ca publisher not (yet) run: the cluster CA file is the same thing
    if data is None:
        if ref.get("optional"):
            return {}
        raise PodConfigError(f"{_pod_label(pod)}: volume needs {kind} {name!r}, which is missing")
    items = ref.get("items")
    if not items:
        return dict(data)
    files = {}
    for item in items:
        if item["key"] in data:
            files[item["path"]] = data[item["key"]]
        elif not ref.get("optional"):
            raise PodConfigError(f"{_pod_label(pod)}: volume item needs key {item['key']!r} of {kind} {name!r}")
    return files


def volume_files(pod: dict, volume: dict, *, objects: Objects, tokens: Mapping[tuple[str, int], str],
                 pod_ip: str, node_name: str, ca_pem: str | None = None) -> dict[str, str] | None:
    """``{relative path: content}`` of a file-backed volume; ``None`` for emptyDir/hostPath (plain dirs).

    Raises:
        PodConfigError: unsupported volume type or missing referenced object.
    """
    kinds = [k for k in volume if k != "name"]
    if not kinds or kinds[0] not in SUPPORTED_VOLUMES:
        raise PodConfigError(f"{_pod_label(pod)}: volume {volume.get('name')!r} of type {kinds} is not supported "
                             f"by the process kubelet (supported: {', '.join(SUPPORTED_VOLUMES)})")
    if "emptyDir" in volume or "hostPath" in volume:
        return None
    if "downwardAPI" in volume:
        return downward_files(pod, volume["downwardAPI"].get("items") or [], pod_ip=pod_ip, node_name=node_name)
    if "configMap" in volume:
        return _object_files(pod, "ConfigMap", volume["configMap"], objects, ca_pem)
    if "secret" in volume:
        return _object_files(pod, "Secret", volume["secret"], objects, ca_pem)
    files: dict[str, str] = {}
    for s in volume["projected"].get("sources") or []:
        if "serviceAccountToken" in s:
            t = s["serviceAccountToken"]
            files[t["path"]] = tokens[(t.get("audience") or "", int(t.get("expirationSeconds") or 3600))]
        elif "configMap" in s:
            files.update(_object_files(pod, "ConfigMap", s["configMap"], objects, ca_pem))
        elif "secret" in s:
            files.update(_object_files(pod, "Secret", s["secret"], objects, ca_pem))
        elif "downwardAPI" in s:
            files.update(downward_files(pod, s["downwardAPI"].get("items") or [], pod_ip=pod_ip,
                                        node_name=node_name))
        else:
            raise PodConfigError(f"{_pod_label(pod)}: projected source {sorted(s)} is not supported")
    return files


def decode_secret(data: Mapping[str, str | bytes] | None) -> dict[str, str]:
    """A Secret's base64 ``data`` decoded to text (binary values are not supported)."""
    return {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (data or {}).items()}


# --- the plan ------------------------------------------------------------------------------------------------

def launch_plan(pod: dict, container: dict, paths: PodPaths, ctx: EnvContext, objects: Objects) -> LaunchPlan:
    """Everything needed to start ``container`` of ``pod`` as a process.

    Raises:
        PodConfigError: the container has neither command nor args, or env/mount errors (see above).
    """
    mounts = mounts_for(pod, container, paths)
    env = container_env(pod, container, ctx, objects, mounts)
    namespace = (pod.get("metadata") or {}).get("namespace", "default")
    words = list(container.get("command") or []) + list(container.get("args") or [])
    if not words:
        raise PodConfigError(f"{_pod_label(pod)}: container {container.get('name')!r} has no command or args; "
                             "the process kubelet ignores images, so it has no entrypoint to run")
    argv = [rewrite_paths(rewrite_dns(expand(w, env), namespace, ctx.subdomains, ctx.address_space), mounts) for w in words]
    # The termination message (a real kubelet mounts a fresh file at terminationMessagePath and copies it into
    # state.terminated.message at exit): a host file per container, its path in the variable the runtime reads.
    env.setdefault("REPRIEVE_TERMINATION_LOG", str(paths.termination_log(container.get("name", ""))))
    cwd = paths.root
    if container.get("workingDir"):
        mapped = rewrite_paths(container["workingDir"], mounts)
        cwd = Path(mapped) if mapped != container["workingDir"] else paths.in_root(container["workingDir"])
    return LaunchPlan(container.get("name", ""), argv, env, cwd, mounts)
