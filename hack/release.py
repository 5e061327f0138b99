#!/usr/bin/env python3
"""The release, end to end: the one script `.github/workflows/release.yml` and the tests run.

    python hack/release.py publish --tag v0.1.0 --registry ghcr.io --namespace reprieve-dev \\
        --index-url https://upload.pypi.org/legacy/ --index-simple-url https://pypi.org/simple/ \\
        [--builder dockerfile --platforms linux/amd64,linux/arm64 | --builder local] [--ca-file CA]
        [--sign-key NAME --keyring secring.gpg]
    python hack/release.py install --version 0.1.0 --registry R --namespace N [--helm-release reprieve -n NS]
        [--venv DIR --what runtime|operator ...] [--verify-keyring pubring.gpg]

Credentials come from the environment: REGISTRY_USERNAME / REGISTRY_PASSWORD and INDEX_USERNAME / INDEX_PASSWORD
(and SIGN_KEY_PASSPHRASE when the signing key has one). ``--sign-key/--keyring`` signs the chart with GPG (helm
package --sign: a ``.prov`` provenance file that helm push puts beside the chart); the keyring is a legacy secret
keyring, what helm reads: ``gpg --export-secret-keys NAME > secring.gpg``.
``publish`` checks first (tag = pyprojects = chart = Dockerfiles' version; the registry takes the credentials;
the index takes them and has no wheel of this version; no release record of this version exists; the builder can
build every platform asked for) and pushes nothing if any check fails. Then it builds the images, pushes them,
packages the chart with the operator image by digest and pushes it as OCI, builds and uploads both wheels, and
pushes the release record last (:mod:`releaseplan`). ``install`` reads the record first and installs nothing
without it. Exit codes: 0 done, 1 a step failed, 2 a check failed before anything was pushed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import release_version
import releaseplan as plan
import releasesbom as sbom
from releaseio import (
    Endpoint,
    Registry,
    ReleaseError,
    build_wheels,
    ca_bundle,
    cert_dir,
    run,
    sha256_file,
    write_authfile,
)

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "reprieve"
DOCKERFILES = {"operator": REPO / "operator" / "Dockerfile", "example": REPO / "examples" / "Dockerfile"}


class CheckFailed(ReleaseError):
    """A pre-flight check failed: nothing was pushed."""


def log(msg: str) -> None:
    print(f"release: {msg}", file=sys.stderr, flush=True)


def podman_env() -> dict[str, str]:
    """hack/build-images.sh's own container storage, when it is there (the local builder's images live in it)."""
    cache = Path(os.environ.get("REPRIEVE_CACHE", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                                / "reprieve"))
    conf = cache / "containers"
    if (conf / "storage.conf").exists():
        return {"CONTAINERS_STORAGE_CONF": str(conf / "storage.conf"), "CONTAINERS_CONF": str(conf / "containers.conf")}
    return {}


class Publisher:
    def __init__(self, args: argparse.Namespace, registry: Endpoint, index: Endpoint, work: Path) -> None:
        self.args, self.registry, self.index, self.work = args, registry, index, work
        self.version = ""
        self.signer: dict[str, str] | None = None
        self.oci = Registry(registry)
        self.authfile = write_authfile(work / "auth.json", registry)
        self.certs = cert_dir(work / "certs", registry)
        self.env = podman_env()
        self.timings: dict[str, float] = {}

    def _timed(self, name: str, t0: float) -> None:
        self.timings[name] = time.monotonic() - t0
        log(f"{name} done in {self.timings[name]:.1f}s")

    # -- 1. checks: nothing is pushed unless every one passes ---------------------------------------------------
    def check(self) -> None:
        t0 = time.monotonic()
        problems = release_version.disagreements(release_version.versions(), self.args.tag)
        if problems:
            raise CheckFailed("versions disagree (fix them, tag again):\n  " + "\n  ".join(problems))
        self.version = release_version.versions()["pyproject.toml"]
        platforms = self.args.platforms.split(",")
        binfmt = {p.name for p in Path("/proc/sys/fs/binfmt_misc").glob("qemu-*")}
        bad = plan.unbuildable(platforms, platform.machine(), binfmt)
        if self.args.builder == "local" and platforms != [f"linux/{plan.ARCH_ALIASES[platform.machine()]}"]:
            bad.append(f"--builder local builds this machine's architecture only (its base is made by mmdebstrap "
                       f"here), not {self.args.platforms}")
        if bad:
            raise CheckFailed("the builder cannot build every platform asked for:\n  " + "\n  ".join(bad))
        self.signer = self._check_signing()  # local, so first: a key that cannot sign fails fast
        login = ["podman", "login", "--authfile", str(self.authfile), "--username", self.registry.username,
                 "--password-stdin", *(["--cert-dir", str(self.certs)] if self.certs else []), self.registry.url]
        try:
            run("registry login", login, input=self.registry.password, env=self.env, timeout=60,
                hint="check REGISTRY_USERNAME / REGISTRY_PASSWORD and that the registry is up; nothing was pushed")
        except ReleaseError as err:
            raise CheckFailed(str(err)) from None
        if self.oci.has_record(self.args.namespace, self.version):
            raise CheckFailed(f"{self.registry.url}/{self.args.namespace}/{plan.RECORD_REPO}:{self.version} exists: "
                              f"version {self.version} is released already; bump the version (nothing was pushed)")
        self._check_index()
        self._timed("checks", t0)

    def _sign_args(self) -> list[str]:
        args = ["--sign", "--key", self.args.sign_key, "--keyring", self.args.keyring]
        passphrase = os.environ.get("SIGN_KEY_PASSPHRASE", "")
        if passphrase:
            f = self.work / "passphrase"
            f.write_text(passphrase)
            f.chmod(0o600)
            args += ["--passphrase-file", str(f)]
        return args

    def _check_signing(self) -> dict[str, str] | None:
        """Sign the chart as it is in the repository, once, before anything is pushed: a missing keyring, a key not
        in it or a wrong passphrase stops the release here. Returns who signs (None: unsigned)."""
        problems = plan.signing_problems(self.args.sign_key, self.args.keyring, Path(self.args.keyring).is_file())
        if problems:
            raise CheckFailed("\n  ".join(problems))
        if not self.args.sign_key:
            log("the chart will NOT be signed (no --sign-key/--keyring): `helm install --verify` will refuse it")
            return None
        trial = self.work / "sign-check"
        try:
            out = run("helm package --sign", [self.args.helm, "package", str(CHART), "--destination", str(trial),
                                              *self._sign_args()])
            tgz = out.strip().rsplit(": ", 1)[-1]
            said = run("helm verify", [self.args.helm, "verify", tgz, "--keyring", self.args.keyring])
        except ReleaseError as err:
            raise CheckFailed(f"{err}\n{plan.sign_advice(str(err), self.args.sign_key, self.args.keyring)} "
                              f"(nothing was pushed)") from None
        signer = plan.signer_of(said)
        if signer is None:
            raise CheckFailed(f"helm verify said no signer:\n{said}")
        log(f"the chart will be signed by {signer['signer']} (key {signer['fingerprint']})")
        return signer

    def _check_index(self) -> None:
        from releaseio import http

        simple = self.args.index_simple_url or self.index.url.rstrip("/") + "/simple/"
        auth = f"Basic {self.index.basic()}" if self.index.username else None
        for dist, wheel in plan.wheel_files(self.version).items():
            url = f"{simple.rstrip('/')}/{dist}/"
            status, _, body = http(self.index, "GET", url, auth=auth, headers={"Accept": "text/html"})
            if status == 404:
                continue
            problem = plan.http_problem(status, "the package index", url,
                                        user_hint="check INDEX_USERNAME / INDEX_PASSWORD")
            if problem:
                raise CheckFailed(problem + (f" ({body[:120].decode(errors='replace')})" if status == 0 else ""))
            if plan.index_has(body.decode(errors="replace"), [wheel]):
                raise CheckFailed(f"the package index {simple} has {wheel} already: an index never replaces a "
                                  f"file, so version {self.version} cannot be published again; bump the version "
                                  f"(nothing was pushed)")

    # -- 2. images ------------------------------------------------------------------------------------------------
    def build_images(self) -> dict[str, str]:
        """Image name -> local reference (a manifest list for the dockerfile builder)."""
        t0 = time.monotonic()
        refs: dict[str, str] = {}
        if self.args.builder == "local":
            out = run("build images", ["bash", str(REPO / "hack" / "build-images.sh")], timeout=3600)
            for line in out.splitlines():
                name, ref, _archive = line.split()
                if name in plan.IMAGES:
                    refs[name] = ref
        else:
            created = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            for name, dockerfile in DOCKERFILES.items():
                ref = f"localhost/release/{plan.IMAGES[name]}:{self.version}"
                subprocess.run(["podman", "manifest", "rm", ref], capture_output=True, env={**os.environ, **self.env},
                               check=False)
                run(f"build image {name}", ["podman", "build", "--platform", self.args.platforms, "--manifest", ref,
                                            "--build-arg", f"VERSION={self.version}",
                                            "--build-arg", f"REVISION={self.args.revision}",
                                            "--build-arg", f"CREATED={created}", "-f", str(dockerfile), str(REPO)],
                    env=self.env, timeout=7200)
                refs[name] = ref
        labels = {}
        for name, ref in refs.items():
            if self.args.builder == "local":
                out = run("inspect image", ["podman", "image", "inspect", "--format",
                                            "{{range $k, $v := .Labels}}{{$k}}={{$v}}\n{{end}}", ref], env=self.env)
                labels[name] = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        problems = plan.image_label_problems(labels, self.version)
        if problems:
            raise CheckFailed("the built images are not this version (nothing was pushed):\n  " + "\n  ".join(problems))
        self._timed("build images", t0)
        return refs

    def push_images(self, refs: dict[str, str]) -> dict[str, str]:
        """Image name -> pushed digest."""
        t0 = time.monotonic()
        digests = {}
        for name, ref in refs.items():
            target = f"docker://{plan.image_repo(self.registry.url, self.args.namespace, name)}:{self.version}"
            digestfile = self.work / f"{name}.digest"
            common = ["--authfile", str(self.authfile), *(["--cert-dir", str(self.certs)] if self.certs else []),
                      "--digestfile", str(digestfile)]
            cmd = (["podman", "push", *common, ref, target] if self.args.builder == "local"
                   else ["podman", "manifest", "push", "--all", *common, ref, target])
            t1 = time.monotonic()
            run(f"push image {name}", cmd, env=self.env, timeout=3600)
            digests[name] = digestfile.read_text().strip()
            log(f"pushed {target} ({digests[name]}) in {time.monotonic() - t1:.1f}s")
        self._timed("push images", t0)
        return digests

    def push_sboms(self, refs: dict[str, str], digests: dict[str, str]) -> dict[str, str]:
        """Image name -> the digest of its SBOM artifact (releasesbom); the dockerfile builder's multi-platform
        images get none yet (a gap: one SBOM per platform image would be needed)."""
        if self.args.builder != "local":
            log("SBOMs: not made for multi-platform builds yet (buildah 1.30+ --sbom on CI would be the way)")
            return {}
        t0 = time.monotonic()
        created = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        out = {}
        for name, ref in refs.items():
            root = Path(run(f"mount image {name}", ["podman", "image", "mount", ref], env=self.env).strip())
            try:
                debs, pythons = sbom.inventory(root)
            finally:
                subprocess.run(["podman", "image", "unmount", ref], capture_output=True,
                               env={**os.environ, **self.env}, check=False)
            repo = f"{self.args.namespace}/{plan.IMAGES[name]}"
            doc = sbom.dumps(sbom.spdx(f"{self.registry.url}/{repo}", digests[name], debs=debs, pythons=pythons,
                                       created=created))
            media, size = self.oci.manifest_info(repo, digests[name])
            manifest = sbom.sbom_manifest(digests[name], size, self.oci.push_blob(repo, b"{}"),
                                          self.oci.push_blob(repo, doc), len(doc))
            manifest["subject"]["mediaType"] = media
            tag = digests[name].replace(":", "-") + ".sbom"
            out[name] = self.oci.put_manifest(repo, tag, manifest)
            log(f"SBOM of {name}: {len(debs)} Debian packages, {len(pythons)} Python distributions -> "
                f"{self.registry.url}/{repo}:{tag}")
        self._timed("sboms", t0)
        return out

    # -- 3. chart -------------------------------------------------------------------------------------------------
    def push_chart(self, operator_digest: str) -> str:
        t0 = time.monotonic()
        helm = self.args.helm
        src = self.work / "chart" / "reprieve"
        shutil.copytree(CHART, src)
        values = plan.chart_values(self.registry.url, self.args.namespace, self.version, operator_digest)
        (src / "values.yaml").write_text(plan.released_values_text((src / "values.yaml").read_text(), values))
        run("helm lint", [helm, "lint", "--strict", str(src)])
        out = run("helm package", [helm, "package", str(src), "--version", self.version, "--app-version",
                                   self.version, "--destination", str(self.work / "dist"),
                                   *(self._sign_args() if self.signer else [])])
        tgz = Path(out.strip().rsplit(": ", 1)[-1])
        if self.signer:  # helm push sends <chart>.tgz.prov as the provenance layer when it lies beside the chart
            if not Path(f"{tgz}.prov").is_file():
                raise ReleaseError(f"helm package --sign made no {tgz}.prov")
            run("helm verify", [helm, "verify", str(tgz), "--keyring", self.args.keyring])
        tls = ["--ca-file", str(self.registry.ca_file)] if self.registry.ca_file else []
        said = run("helm push", [helm, "push", str(tgz), f"oci://{self.registry.url}/{self.args.namespace}/charts",
                                 "--registry-config", str(self.authfile), *tls], timeout=600, stderr_too=True)
        m = re.search(r"Digest:\s*(sha256:[0-9a-f]{64})", said)
        if not m:
            raise ReleaseError(f"helm push: no digest in its output:\n{said}")
        log(f"pushed chart oci://{self.registry.url}/{self.args.namespace}/charts/reprieve:{self.version} ({m.group(1)}), "
            + (f"signed by {self.signer['signer']} (key {self.signer['fingerprint']})" if self.signer
               else "UNSIGNED (no provenance file)"))
        self._timed("chart", t0)
        return m.group(1)

    # -- 4. wheels --------------------------------------------------------------------------------------------------
    def upload_wheels(self) -> dict[str, str]:
        t0 = time.monotonic()
        out = self.work / "wheels"
        build_wheels([REPO, REPO / "operator"], out)
        files = [out / f for f in plan.wheel_files(self.version).values()]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise ReleaseError(f"build wheels: {missing} not built (found {sorted(p.name for p in out.iterdir())})")
        tls, env = [], {}
        if self.index.ca_file:  # requests prefers REQUESTS_CA_BUNDLE (often set) over twine's --cert: set both
            bundle = str(ca_bundle(self.work / "ca-bundle.pem", self.index.ca_file))
            tls, env = ["--cert", bundle], {"REQUESTS_CA_BUNDLE": bundle, "CURL_CA_BUNDLE": bundle}
        run("upload wheels", [self.args.twine, "upload", "--non-interactive", "--disable-progress-bar",
                              "--repository-url", self.index.url, *tls, *map(str, files)],
            env={**env, "TWINE_USERNAME": self.index.username, "TWINE_PASSWORD": self.index.password}, timeout=600,
            hint="the images and the chart are pushed but no release record is: this version is not released "
                 "and will not be installed; fix the index and run the release again")
        self._timed("wheels", t0)
        return {f.name: sha256_file(f) for f in files}

    # -- all --------------------------------------------------------------------------------------------------------
    def publish(self) -> dict:
        t0 = time.monotonic()
        self.check()
        refs = self.build_images()
        digests = self.push_images(refs)
        sboms = self.push_sboms(refs, digests)
        chart_digest = self.push_chart(digests["operator"])
        wheels = self.upload_wheels()
        record = plan.record(self.version, registry=self.registry.url, namespace=self.args.namespace,
                             images=digests, chart_digest=chart_digest, wheels=wheels, index_url=self.index.url,
                             revision=self.args.revision, signer=self.signer)
        record["sboms"] = {name: f"{plan.image_repo(self.registry.url, self.args.namespace, name)}@{d}"
                           for name, d in sboms.items()}
        if self.args.out:  # what a GitHub release attaches: the chart, the wheels, the record
            out = Path(self.args.out)
            out.mkdir(parents=True, exist_ok=True)
            for f in [*(self.work / "dist").glob("*.tgz*"), *(self.work / "wheels").glob("*.whl")]:
                shutil.copy2(f, out / f.name)
            (out / f"reprieve-{self.version}.release.json").write_text(json.dumps(record, indent=1))
        digest = self.oci.push_record(self.args.namespace, self.version, record)
        log(f"release record {self.registry.url}/{self.args.namespace}/{plan.RECORD_REPO}:{self.version} pushed "
            f"({digest}): version {self.version} is released")
        self.timings["total"] = time.monotonic() - t0
        log("timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items()))
        return record


def endpoints(args: argparse.Namespace) -> tuple[Endpoint, Endpoint]:
    ca = Path(args.ca_file) if args.ca_file else None
    reg = Endpoint(args.registry, os.environ.get("REGISTRY_USERNAME", ""), os.environ.get("REGISTRY_PASSWORD", ""), ca)
    idx = Endpoint(getattr(args, "index_url", "") or "", os.environ.get("INDEX_USERNAME", ""),
                   os.environ.get("INDEX_PASSWORD", ""), ca)
    return reg, idx


def main(argv: list[str] | None = None) -> int:
    import releaseinstall

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pub = sub.add_parser("publish", help="check, build, push images + chart + wheels, then the release record")
    pub.add_argument("--tag", required=True, help="the release tag, e.g. v0.1.0")
    pub.add_argument("--index-url", required=True, help="the index's upload URL (twine --repository-url)")
    pub.add_argument("--index-simple-url", default="", help="its simple API (default: <index-url>/simple/)")
    pub.add_argument("--builder", choices=("local", "dockerfile"), default="dockerfile",
                     help="local: hack/build-images.sh (cached, this architecture); dockerfile: podman build "
                          "--platform from the Dockerfiles' pinned bases")
    pub.add_argument("--platforms", default="linux/amd64,linux/arm64")
    pub.add_argument("--revision", default=os.environ.get("GITHUB_SHA", "unknown"))
    pub.add_argument("--helm", default=shutil.which("helm") or "helm")
    pub.add_argument("--twine", default=shutil.which("twine") or "twine")
    pub.add_argument("--out", default="", help="copy the chart package, the wheels and the record here")
    pub.add_argument("--sign-key", default="", help="sign the chart with this GPG key (a part of its user id; helm "
                                                    "package --sign --key); needs --keyring")
    pub.add_argument("--keyring", default="", help="the legacy secret keyring holding --sign-key "
                                                   "(gpg --export-secret-keys NAME > secring.gpg)")
    releaseinstall.add_install_parser(sub)
    for sp in sub.choices.values():
        sp.add_argument("--registry", required=True, help="host[:port] of the OCI registry")
        sp.add_argument("--namespace", default="reprieve-dev", help="path under the registry")
        sp.add_argument("--ca-file", default="", help="CA of the registry's and index's certificates")
    args = p.parse_args(argv)
    registry, index = endpoints(args)
    try:
        if args.cmd == "install":
            releaseinstall.install(args, registry, index)
            return 0
        with tempfile.TemporaryDirectory(prefix="reprieve-release-") as work:
            Publisher(args, registry, index, Path(work)).publish()
        return 0
    except CheckFailed as err:
        log(f"{err}")
        return 2
    except ReleaseError as err:
        log(f"{err}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
