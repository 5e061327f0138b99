"""What a release publishes and how it is checked (pure; hack/release.py does the I/O).

A release of version V to a registry R (namespace N) and a package index I is, in the order it is pushed:

1. the images ``R/N/reprieve-operator:V`` and ``R/N/reprieve-example:V`` (their version label must be V);
2. the chart ``oci://R/N/charts/reprieve:V``, whose values name the operator image by digest;
3. the wheels ``reprieve-V-py3-none-any.whl`` and ``reprieve_operator-V-py3-none-any.whl`` on I;
4. last, the *release record* ``R/N/reprieve-release:V``: a small OCI artifact listing every digest above.

An install starts from the record: no record, no install, so a push that stopped half-way is never installed as
a release (its leftovers are pushed again by the next attempt, and wheels — which an index never lets you replace
— are found by the pre-flight before anything is pushed).
"""

from __future__ import annotations

import re
from typing import Any

IMAGES = {"operator": "reprieve-operator", "example": "reprieve-example"}
RECORD_REPO = "reprieve-release"
RECORD_MEDIA_TYPE = "application/vnd.reprieve.release.v1+json"
RECORD_CONFIG_MEDIA_TYPE = "application/vnd.reprieve.release.config.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# Architectures by the name Go, OCI and binfmt_misc give them.
ARCH_ALIASES = {"x86_64": "amd64", "aarch64": "arm64", "amd64": "amd64", "arm64": "arm64"}
QEMU_BINFMT = {"amd64": "qemu-x86_64", "arm64": "qemu-aarch64"}


def image_repo(registry: str, namespace: str, name: str) -> str:
    return f"{registry}/{namespace}/{IMAGES.get(name, name)}"


def wheel_files(version: str) -> dict[str, str]:
    """Distribution name -> the wheel file a release of ``version`` uploads."""
    return {"reprieve": f"reprieve-{version}-py3-none-any.whl",
            "reprieve-operator": f"reprieve_operator-{version}-py3-none-any.whl"}


def unbuildable(platforms: list[str], host_machine: str, binfmt: set[str]) -> list[str]:
    """The platforms this builder cannot build, each with why: its own architecture always; another one only with a
    qemu binfmt_misc handler registered (``binfmt`` lists /proc/sys/fs/binfmt_misc)."""
    host = ARCH_ALIASES.get(host_machine, host_machine)
    problems = []
    for platform in platforms:
        os_, _, arch = platform.partition("/")
        if os_ != "linux" or arch not in QEMU_BINFMT:
            problems.append(f"{platform}: not a platform the images are built for (linux/amd64, linux/arm64)")
        elif arch != host and QEMU_BINFMT[arch] not in binfmt:
            problems.append(f"{platform}: this {host} builder has no {QEMU_BINFMT[arch]} binfmt_misc handler "
                            f"(Debian: apt-get install qemu-user-static binfmt-support; CI: "
                            f"docker/setup-qemu-action)")
    return problems


def image_label_problems(labels: dict[str, dict[str, str]], version: str) -> list[str]:
    """Images whose ``org.opencontainers.image.version`` label is not the release's version."""
    out = []
    for name, lab in sorted(labels.items()):
        found = lab.get("org.opencontainers.image.version", "(no label)")
        if found != version:
            out.append(f"image {name}: label org.opencontainers.image.version is {found} (expected {version})")
    return out


def chart_values(registry: str, namespace: str, version: str, operator_digest: str) -> dict[str, Any]:
    """The values a released chart ships with: the operator image of this release, by digest."""
    if not DIGEST.match(operator_digest):
        raise ValueError(f"operator image digest must be sha256:<64 hex>, got {operator_digest!r}")
    return {"image": {"repository": image_repo(registry, namespace, "operator"), "tag": version,
                      "digest": operator_digest}}


def record(version: str, *, registry: str, namespace: str, images: dict[str, str], chart_digest: str,
           wheels: dict[str, str], index_url: str, revision: str = "",
           signer: dict[str, str] | None = None) -> dict[str, Any]:
    """The release record: what was published, by digest (images, chart) and sha256 (wheels); whether the chart
    carries a provenance file and, if so, who signed it (``signer``: :func:`signer_of`'s answer)."""
    chart: dict[str, Any] = {"ref": f"oci://{registry}/{namespace}/charts/reprieve", "version": version,
                             "digest": chart_digest, "signed": signer is not None}
    if signer is not None:
        chart.update(signer)
    return {
        "version": version, "revision": revision,
        "images": {name: f"{image_repo(registry, namespace, name)}@{digest}" for name, digest in sorted(images.items())},
        "chart": chart,
        "wheels": dict(sorted(wheels.items())), "index": index_url,
    }


def record_problems(rec: dict[str, Any], version: str) -> list[str]:
    """Why a fetched release record cannot be installed (empty: it can)."""
    problems = []
    if rec.get("version") != version:
        problems.append(f"release record: version is {rec.get('version')!r} (expected {version!r})")
    images = rec.get("images") or {}
    for name in IMAGES:
        ref = images.get(name, "")
        if not DIGEST.match(ref.rpartition("@")[2]):
            problems.append(f"release record: images.{name} must be <repository>@sha256:<64 hex>, got {ref!r}")
    if not DIGEST.match((rec.get("chart") or {}).get("digest", "")):
        problems.append("release record: chart.digest missing or not sha256:<64 hex>")
    missing = set(wheel_files(version).values()) - set(rec.get("wheels") or {})
    if missing:
        problems.append(f"release record: wheels lack {sorted(missing)}")
    return problems


def http_problem(status: int, what: str, url: str, *, user_hint: str) -> str | None:
    """A message for a pre-flight answer that stops the release (None: 2xx, go on)."""
    if 200 <= status < 300:
        return None
    if status == 0:
        return (f"{what} at {url} does not answer (connection refused, timed out or a TLS failure): start it "
                f"(local: python -m localcluster up --registry) or fix the address; nothing was pushed")
    if status in (401, 403):
        return f"{what} at {url} refused the credentials ({status}): {user_hint}; nothing was pushed"
    return f"{what} at {url} answered {status}; nothing was pushed"


def index_has(simple_page: str, files: list[str]) -> list[str]:
    """Which of ``files`` an index's /simple/<project>/ page already lists."""
    return [f for f in files if re.search(rf">{re.escape(f)}<|/{re.escape(f)}[#\"]", simple_page)]


def released_values_text(text: str, values: dict[str, Any]) -> str:
    """``values.yaml`` with the ``image:`` block's repository, tag and digest replaced (the comments, which the
    chart's README and ``helm show values`` carry, stay). Raises ValueError when a key is not found there."""
    head, sep, rest = ("\n" + text).partition("\nimage:\n")
    if not sep:
        raise ValueError("values.yaml has no top-level `image:` block")
    block_end = re.search(r"^\S", rest, re.MULTILINE)
    block, tail = (rest[:block_end.start()], rest[block_end.start():]) if block_end else (rest, "")
    for key, value in values["image"].items():
        line = f"  {key}: {json_str(value)}".replace("\\", "\\\\")  # a replacement template: escape backslashes
        block, n = re.subn(rf"^  {key}: .*$", line, block, count=1, flags=re.MULTILINE)
        if n != 1:
            raise ValueError(f"values.yaml: image.{key} not found in the `image:` block")
    return (head + sep + block + tail)[1:]


def json_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def not_from(index_url: str, urls: list[str]) -> list[str]:
    """Of the URLs pip installed from (its ``--report``), those not under ``index_url``, without credentials."""
    root = index_url.rstrip("/") + "/"
    plain = [re.sub(r"^([a-z+]+://)[^/@]*@", r"\1", u) for u in urls]
    return [u for u in plain if not u.startswith(root)]


# -- chart signing: helm's provenance files (a GPG signature made offline, no outside service) ----------------------
def signing_problems(sign_key: str, keyring: str, keyring_exists: bool) -> list[str]:
    """Why ``publish --sign-key/--keyring`` cannot sign (empty: it can try; helm then finds the key or not)."""
    if not sign_key and not keyring:
        return []
    if not sign_key or not keyring:
        return [("--sign-key and --keyring go together: the key's name (a part of its user id, helm package --key) "
                "and the legacy secret keyring holding it (gpg --export-secret-keys > secring.gpg)")]
    if not keyring_exists:
        return [(f"--keyring {keyring}: no such file; export one from gpg: gpg --export-secret-keys "
                f"{sign_key!r} > secring.gpg (nothing was pushed)")]
    return []


def sign_advice(helm_error: str, sign_key: str, keyring: str) -> str:
    """What to do when ``helm package --sign`` refuses (its message is shown beside this)."""
    if "private key not found" in helm_error:
        return (f"no key whose user id contains {sign_key!r} in {keyring}: list them with `gpg --show-keys "
                f"{keyring}` and pass a part of one user id as --sign-key")
    if "not a private key" in helm_error:
        return (f"{keyring} holds public keys only: helm signs with a secret keyring (gpg --export-secret-keys "
                f"{sign_key!r} > secring.gpg)")
    if "too many" in helm_error or "ambiguous" in helm_error:
        return f"more than one key in {keyring} matches {sign_key!r}: pass more of the user id as --sign-key"
    if "passphrase" in helm_error:
        return "the key has a passphrase: set SIGN_KEY_PASSPHRASE (helm package --passphrase-file)"
    return f"check --sign-key {sign_key!r} and --keyring {keyring}"


def signer_of(helm_verify_output: str) -> dict[str, str] | None:
    """``helm verify``'s / ``helm pull --verify``'s report -> {"signer": user id, "fingerprint": hex}; None when it
    has no signer lines."""
    who = re.search(r"^Signed by: (.+)$", helm_verify_output, re.MULTILINE)
    fpr = re.search(r"^Using Key With Fingerprint: ([0-9A-Fa-f]+)$", helm_verify_output, re.MULTILINE)
    if not who or not fpr:
        return None
    return {"signer": who.group(1).strip(), "fingerprint": fpr.group(1).upper()}


def verify_advice(helm_error: str, keyring: str) -> str:
    """What to do when ``helm pull|install --verify`` refuses the chart (helm's message is shown beside this)."""
    if "failed to fetch provenance" in helm_error:
        return ("the chart has no provenance file: this release was published unsigned (publish --sign-key "
                "--keyring signs it); install without --verify-keyring only if you accept an unsigned chart")
    if "unknown entity" in helm_error:
        return (f"the chart is signed by a key that is not in {keyring}: get the release's public key "
                "(gpg --export KEY > pubring.gpg) and check its fingerprint against the release record's")
    if "does not match" in helm_error or "does not contain a SHA" in helm_error:
        return "the chart does not match its provenance file: do not install it; publish the release again"
    return f"helm could not verify the chart against {keyring}"


def unverified_warning(rec: dict[str, Any], verify_keyring: str) -> str | None:
    """The warning for an install that could verify the chart's signature and does not (None: nothing to say)."""
    chart = rec.get("chart") or {}
    if verify_keyring or not chart.get("signed"):
        return None
    return (f"the chart is signed (key {chart.get('fingerprint', '?')}, {chart.get('signer', '?')}) but is installed "
            "without checking the signature: pass --verify-keyring PUBRING (gpg --export KEY > pubring.gpg)")
