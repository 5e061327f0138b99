"""``hack/release.py install``: install a release only from its registry and index, starting from its record.

No release record, no install: a publish that stopped half-way left images or a chart but no record, and is
refused here with what to do. With a record, the chart is pulled by its digest (``helm install
oci://<registry>/<namespace>/charts/reprieve:<version>@<digest>``) and its rendered Deployment must name the operator
image by the record's digest; each ``--venv DIR=runtime|operator`` gets a fresh virtual environment with
``reprieve[runtime]`` or ``reprieve-operator`` from the index, and the wheel pip installed must have the record's
sha256. Without ``--extra-index-url`` every distribution pip installs (the dependencies too) must come from the
index: the local cluster's index serves the locks' dependencies from the release tools' wheelhouse.

``--verify-keyring PUBRING`` checks the chart's GPG signature first: ``helm pull --verify --keyring`` fetches the
chart with its provenance file, its digest must be the record's, and ``helm install --verify`` then installs that
very file. A chart without provenance, or signed by a key not in PUBRING, is refused with helm's message and nothing
is installed (with or without ``--helm-release``: without it, this only verifies). A record that says the chart is
signed, installed without ``--verify-keyring``, gets a warning.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import releaseplan as plan
from releaseio import Endpoint, Registry, ReleaseError, ca_bundle, run, write_authfile

SPECS = {"runtime": ("reprieve", "reprieve[runtime]=={v}"), "operator": ("reprieve-operator", "reprieve-operator=={v}")}


def add_install_parser(sub: Any) -> None:
    ins = sub.add_parser("install", help="install a release from its record: chart by digest, wheels from the index")
    ins.add_argument("--version", required=True)
    ins.add_argument("--index-url", default="", help="the index root (pip uses <root>/simple/)")
    ins.add_argument("--extra-index-url", default="",
                     help="where pip finds the dependencies (jax, kopf, ...) when the index does not serve them "
                          "(default: none, every distribution must come from --index-url)")
    ins.add_argument("--helm-release", default="", help="helm install this release name ('' : no chart)")
    ins.add_argument("--helm-namespace", default="reprieve-system")
    ins.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ""))
    ins.add_argument("--helm", default=shutil.which("helm") or "helm")
    ins.add_argument("--set", action="append", default=[], help="helm --set (repeatable)")
    ins.add_argument("--venv", action="append", default=[], help="DIR=runtime|operator (repeatable)")
    ins.add_argument("--record-out", default="", help="write the release record (JSON) here")
    ins.add_argument("--verify-keyring", default="",
                     help="public keyring (gpg --export KEY > pubring.gpg): refuse a chart not signed by one of its "
                          "keys (helm pull|install --verify)")
    ins.add_argument("--no-compile", action="store_true",
                     help="pip install --no-compile into the venvs: no byte-compiling at install (about 3/4 of an "
                          "install's CPU for jax and kubernetes); modules compile when first imported")


def fetch(registry: Endpoint, namespace: str, version: str) -> dict[str, Any]:
    """The release record, checked; ReleaseError when there is none or it is unusable."""
    rec = Registry(registry).fetch_record(namespace, version)
    where = f"{registry.url}/{namespace}/{plan.RECORD_REPO}:{version}"
    if rec is None:
        raise ReleaseError(f"no release record {where}: version {version} was never published or its publish "
                           f"stopped before the end (images or a chart without a record are not a release); run "
                           f"hack/release.py publish again. Nothing was installed")
    problems = plan.record_problems(rec, version)
    if problems:
        raise ReleaseError(f"release record {where} cannot be installed:\n  " + "\n  ".join(problems))
    return rec


def verify_chart(args: argparse.Namespace, registry: Endpoint, rec: dict[str, Any], work: Path) -> Path:
    """Pull the chart with its provenance, check its signature against --verify-keyring and its digest against the
    record's; the verified .tgz (its .prov beside it). ``helm pull ref@digest --verify`` fails on its own file name
    (helm 3.21: "provenance does not contain a SHA for a file named reprieve@sha256-..."), so the pull is by
    version and the digest helm reports is compared with the record's."""
    chart, keyring = rec["chart"], args.verify_keyring
    if not Path(keyring).is_file():
        raise ReleaseError(f"--verify-keyring {keyring}: no such file (gpg --export KEY > pubring.gpg). Nothing was "
                           f"installed")
    dest = work / "verified"
    dest.mkdir()
    tls = ["--ca-file", str(registry.ca_file)] if registry.ca_file else []
    try:
        said = run("helm pull --verify", [args.helm, "pull", chart["ref"], "--version", chart["version"], "--verify",
                                          "--keyring", keyring, "-d", str(dest), *tls, "--registry-config",
                                          str(write_authfile(work / "auth.json", registry))],
                   timeout=300, stderr_too=True)
    except ReleaseError as err:
        raise ReleaseError(f"{err}\n{plan.verify_advice(str(err), keyring)}. Nothing was installed") from None
    digest = re.search(r"^Digest: (sha256:[0-9a-f]{64})$", said, re.MULTILINE)
    if not digest or digest.group(1) != chart["digest"]:
        raise ReleaseError(f"helm pull --verify: got chart {digest.group(1) if digest else '(no digest)'}, not the "
                           f"record's {chart['digest']}. Nothing was installed")
    signer = plan.signer_of(said) or {}
    print(f"release: chart {chart['ref']}:{chart['version']}@{chart['digest']} verified: signed by "
          f"{signer.get('signer')} (key {signer.get('fingerprint')})", file=sys.stderr)
    return dest / f"reprieve-{chart['version']}.tgz"


def helm_install(args: argparse.Namespace, registry: Endpoint, rec: dict[str, Any], work: Path,
                 verified: Path | None = None) -> None:
    chart = rec["chart"]
    ref = f"{chart['ref']}:{chart['version']}@{chart['digest']}"
    tls = ["--ca-file", str(registry.ca_file)] if registry.ca_file else []
    common = ["--registry-config", str(write_authfile(work / "auth.json", registry)),
              *(["--kubeconfig", args.kubeconfig] if args.kubeconfig else [])]
    what = [str(verified), "--verify", "--keyring", args.verify_keyring] if verified else [ref, *tls]
    run("helm install", [args.helm, "upgrade", "--install", args.helm_release, *what, "-n", args.helm_namespace,
                         "--create-namespace", *common, *[x for s in args.set for x in ("--set", s)]],
        timeout=600)
    manifest = run("helm get manifest", [args.helm, "get", "manifest", args.helm_release, "-n", args.helm_namespace,
                                         *common])
    want = rec["images"]["operator"]
    if f"image: {json.dumps(want)}" not in manifest and f"image: {want}" not in manifest:
        raise ReleaseError(f"helm install {ref}: the rendered Deployment does not run {want} (by digest)")


def pip_install(venv: Path, what: str, rec: dict[str, Any], index: Endpoint, extra_index: str, work: Path, *,
                compile_: bool = True) -> str:
    """A fresh venv with the release's distribution from the index; returns the URL pip got the wheel from."""
    dist, spec = SPECS[what]
    run(f"venv {venv}", [sys.executable, "-m", "venv", "--clear", str(venv)])
    simple = index.url.rstrip("/") + "/simple/"
    scheme, rest = simple.split("://", 1)
    env = {"PIP_INDEX_URL": f"{scheme}://{index.username}:{index.password}@{rest}" if index.username else simple,
           "PIP_FIND_LINKS": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if extra_index:
        env["PIP_EXTRA_INDEX_URL"] = extra_index
    else:  # only the index: no pip.conf may add another (an extra-index-url there, say)
        env["PIP_CONFIG_FILE"] = os.devnull
    if index.ca_file:  # the system's CAs (for the dependencies' index) and the index's own CA
        bundle = str(ca_bundle(work / "ca-bundle.pem", index.ca_file))
        # pip's requests takes REQUESTS_CA_BUNDLE (often set) over --cert: all three name the bundle
        env.update(PIP_CERT=bundle, REQUESTS_CA_BUNDLE=bundle, CURL_CA_BUNDLE=bundle)
    report = work / f"pip-report-{what}.json"
    run(f"pip install {spec.format(v=rec['version'])}",
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *([] if compile_ else ["--no-compile"]),
         "--report", str(report), spec.format(v=rec["version"])], env=env, timeout=1800)
    installed = json.loads(report.read_text())["install"]
    elsewhere = plan.not_from(index.url, [i["download_info"]["url"] for i in installed])
    if elsewhere and not extra_index:
        raise ReleaseError(f"pip install {spec}: {len(elsewhere)} distributions came from outside {index.url}: "
                           f"{elsewhere[:5]}")
    got = next((i for i in installed if i["metadata"]["name"].lower() == dist), None)
    if got is None:
        raise ReleaseError(f"pip install {spec}: pip's report has no {dist}")
    url = re.sub(r"//[^/@]*@", "//", got["download_info"]["url"])  # without the credentials
    sha = got["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256", "")
    wheel = url.rsplit("/", 1)[-1].split("#", 1)[0]
    if not url.startswith(index.url.rstrip("/")) or rec["wheels"].get(wheel) != sha:
        raise ReleaseError(f"pip install {spec}: got {url} (sha256 {sha}), not the release's {wheel} from "
                           f"{index.url} (sha256 {rec['wheels'].get(wheel)})")
    return str(url)


def install(args: argparse.Namespace, registry: Endpoint, index: Endpoint) -> dict[str, Any]:
    rec = fetch(registry, args.namespace, args.version)
    if args.record_out:
        Path(args.record_out).write_text(json.dumps(rec, indent=1))
    with tempfile.TemporaryDirectory(prefix="reprieve-install-") as tmp:
        work = Path(tmp)
        warning = plan.unverified_warning(rec, args.verify_keyring)
        if warning:
            print(f"release: WARNING: {warning}", file=sys.stderr)
        verified = verify_chart(args, registry, rec, work) if args.verify_keyring else None
        if args.helm_release:
            helm_install(args, registry, rec, work, verified)
            print(f"release: helm release {args.helm_release} in {args.helm_namespace} runs "
                  f"{rec['images']['operator']}", file=sys.stderr)
        for item in args.venv:
            venv, _, what = item.rpartition("=")
            if what not in SPECS:
                raise ReleaseError(f"--venv {item}: expected DIR=runtime or DIR=operator")
            url = pip_install(Path(venv), what, rec, index, args.extra_index_url, work, compile_=not args.no_compile)
            print(f"release: {venv} has {SPECS[what][1].format(v=args.version)} from {url.split('#')[0]}",
                  file=sys.stderr)
    return rec
