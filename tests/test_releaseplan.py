"""The release's pure decisions (hack/releaseplan.py): what a builder can build, what must agree, what a record
must hold before anything is installed, the released chart's values. The release itself runs in
tests/test_release_integration.py and tests/e2e/test_release_e2e.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))

import releaseplan as plan

pytestmark = pytest.mark.unit
D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64


@pytest.mark.parametrize("platforms,machine,binfmt,problem", [
    (["linux/amd64"], "x86_64", set(), None),
    (["linux/amd64", "linux/arm64"], "x86_64", {"qemu-aarch64"}, None),
    (["linux/amd64", "linux/arm64"], "x86_64", set(), "linux/arm64: this amd64 builder has no qemu-aarch64"),
    (["linux/arm64"], "aarch64", set(), None),
    (["linux/amd64"], "aarch64", set(), "no qemu-x86_64"),
    (["windows/amd64"], "x86_64", set(), "not a platform the images are built for"),
])
def test_a_builder_builds_its_own_architecture_and_others_only_with_qemu(
        platforms: list[str], machine: str, binfmt: set[str], problem: str | None) -> None:
    got = plan.unbuildable(platforms, machine, binfmt)
    assert (got == []) if problem is None else (len(got) == 1 and problem in got[0]), got


def test_an_image_of_another_version_is_not_pushed() -> None:
    labels = {"operator": {"org.opencontainers.image.version": "0.1.0"}, "example": {}}
    assert plan.image_label_problems(labels, "0.1.0") == [
        "image example: label org.opencontainers.image.version is (no label) (expected 0.1.0)"]
    assert plan.image_label_problems({"operator": labels["operator"]}, "0.1.0") == []


def _record(**over: object) -> dict:
    rec = plan.record("0.2.0", registry="127.0.0.1:5000", namespace="ns", images={"operator": D1, "example": D2},
                      chart_digest=D1, wheels={f: "ab" for f in plan.wheel_files("0.2.0").values()},
                      index_url="https://127.0.0.1:5001/")
    rec.update(over)
    return rec


def test_a_record_names_every_image_by_digest() -> None:
    rec = _record()
    assert rec["images"] == {"example": f"127.0.0.1:5000/ns/reprieve-example@{D2}",
                             "operator": f"127.0.0.1:5000/ns/reprieve-operator@{D1}"}
    assert rec["chart"] == {"ref": "oci://127.0.0.1:5000/ns/charts/reprieve", "version": "0.2.0", "digest": D1,
                            "signed": False}
    assert plan.record_problems(rec, "0.2.0") == []


@pytest.mark.parametrize("over,problem", [
    ({"version": "0.1.0"}, "version is '0.1.0' (expected '0.2.0')"),
    ({"images": {"operator": "r/ns/reprieve-operator:0.2.0"}}, "images.operator must be <repository>@sha256"),
    ({"chart": {"digest": "latest"}}, "chart.digest missing"),
    ({"wheels": {}}, "wheels lack"),
])
def test_a_record_that_is_not_a_whole_release_is_not_installed(over: dict, problem: str) -> None:
    got = plan.record_problems(_record(**over), "0.2.0")
    assert any(problem in g for g in got), got


@pytest.mark.parametrize("status,expected", [
    (200, None), (0, "does not answer"), (401, "refused the credentials (401): check X"), (500, "answered 500"),
])
def test_preflight_messages_say_what_to_do(status: int, expected: str | None) -> None:
    got = plan.http_problem(status, "the package index", "https://i/", user_hint="check X")
    assert got is None if expected is None else (expected in got and "nothing was pushed" in got)


def test_the_index_page_is_searched_for_the_exact_file() -> None:
    page = ('<a href="/packages/reprieve-0.1.0-py3-none-any.whl#sha256=ab">reprieve-0.1.0-py3-none-any.whl</a>\n'
            '<a href="/packages/reprieve-0.1.01-py3-none-any.whl">reprieve-0.1.01-py3-none-any.whl</a>')
    assert plan.index_has(page, ["reprieve-0.1.0-py3-none-any.whl", "reprieve-0.1.1-py3-none-any.whl"]) == [
        "reprieve-0.1.0-py3-none-any.whl"]


def test_an_install_only_from_the_index_names_every_distribution_from_elsewhere() -> None:
    idx = "https://127.0.0.1:8443/"
    urls = ["https://u:p@127.0.0.1:8443/packages/jax-0.10.2-py3-none-any.whl#sha256=ab",
            "https://127.0.0.1:8443/packages/kopf-1.45.2-py3-none-any.whl",
            "https://files.pythonhosted.org/packages/numpy-2.4.6.whl",
            "https://u:p@127.0.0.1:84431/packages/scipy.whl"]  # another port: not the index
    assert plan.not_from(idx, urls) == ["https://files.pythonhosted.org/packages/numpy-2.4.6.whl",
                                        "https://127.0.0.1:84431/packages/scipy.whl"]
    assert plan.not_from(idx.rstrip("/"), urls[:2]) == []


def test_the_released_chart_renders_the_operator_image_by_digest(tmp_path: Path) -> None:
    import shutil

    helm = shutil.which("helm") or str(Path.home() / ".cache/reprieve/bin/helm")
    if not Path(helm).exists():
        pytest.fail("helm missing: make tools builds it")
    chart = tmp_path / "reprieve"
    shutil.copytree(REPO / "charts" / "reprieve", chart)
    text = (chart / "values.yaml").read_text()
    values = plan.chart_values("127.0.0.1:5000", "ns", "0.2.0", D1)
    released = plan.released_values_text(text, values)
    (chart / "values.yaml").write_text(released)
    assert released.count("# --") == text.count("# --")  # the documented values keep their documentation
    assert yaml.safe_load(released)["image"] == {**yaml.safe_load(text)["image"], **values["image"]}
    out = subprocess.run([helm, "template", "r", str(chart), "--kube-version", "1.35.0"], capture_output=True, text=True, check=True).stdout
    images = [line.split("image:", 1)[1].strip().strip('"') for line in out.splitlines()
              if line.strip().startswith("image: ")]
    assert images == [f"127.0.0.1:5000/ns/reprieve-operator@{D1}"]


def test_released_values_refuse_a_values_file_without_the_keys() -> None:
    with pytest.raises(ValueError, match="image.digest not found"):
        plan.released_values_text("image:\n  repository: x\n  tag: y\nother: 1\n",
                                  plan.chart_values("r", "ns", "1.0.0", D1))
    with pytest.raises(ValueError, match="must be sha256"):
        plan.chart_values("r", "ns", "1.0.0", "sha256:short")


def test_the_sbom_lists_what_the_image_holds_by_purl() -> None:
    import releasesbom as sbom

    status = ("Package: libc6\nStatus: install ok installed\nVersion: 2.36-9\n\n"
              "Package: gone\nStatus: deinstall ok config-files\nVersion: 1\n\n"
              "Package: python3.11\nStatus: install ok installed\nVersion: 3.11.2-6\n")
    debs = sbom.dpkg_packages(status)
    assert debs == [("libc6", "2.36-9"), ("python3.11", "3.11.2-6")]
    pythons = sbom.python_packages(["Kopf-1.45.2.dist-info", "typing_extensions-4.15.0.dist-info", "x.pth"])
    assert pythons == [("kopf", "1.45.2"), ("typing-extensions", "4.15.0")]
    doc = sbom.spdx("r/ns/reprieve-operator", D1, debs=debs, pythons=pythons, created="2026-01-01T00:00:00Z")
    purls = [ref["referenceLocator"] for p in doc["packages"] for ref in p.get("externalRefs", [])]
    assert purls == ["pkg:deb/debian/libc6@2.36-9", "pkg:deb/debian/python3.11@3.11.2-6", "pkg:pypi/kopf@1.45.2",
                     "pkg:pypi/typing-extensions@4.15.0"]
    contained = {r["relatedSpdxElement"] for r in doc["relationships"] if r["relationshipType"] == "CONTAINS"}
    assert contained == {p["SPDXID"] for p in doc["packages"][1:]} and len(contained) == 4
    manifest = sbom.sbom_manifest(D1, 10, D2, D2, 5)
    assert manifest["subject"]["digest"] == D1 and manifest["artifactType"] == "application/spdx+json"


FPR = "34E61415A003DAB5A62BB475A88BDA6A29669D6B"
VERIFY_OUT = (f"Pulled: r/ns/charts/reprieve:0.2.0\nDigest: {D1}\nSigned by: Rel <rel@x.invalid>\n"
              f"Using Key With Fingerprint: {FPR.lower()}\nChart Hash Verified: {D2}\n")


@pytest.mark.parametrize("key,keyring,exists,problem", [
    ("", "", False, None),  # unsigned: no problem here (the release says so in its output)
    ("Rel", "secring.gpg", True, None),
    ("Rel", "", False, "go together"),
    ("", "secring.gpg", True, "go together"),
    ("Rel", "secring.gpg", False, "gpg --export-secret-keys 'Rel' > secring.gpg"),
])
def test_signing_needs_a_key_name_and_an_existing_secret_keyring(
        key: str, keyring: str, exists: bool, problem: str | None) -> None:
    got = plan.signing_problems(key, keyring, exists)
    assert (got == []) if problem is None else (len(got) == 1 and problem in got[0]), got


ADVISE = {"sign": lambda error: plan.sign_advice(error, "Rel", "secring.gpg"),
          "verify": lambda error: plan.verify_advice(error, "pub.gpg")}


@pytest.mark.parametrize("step,helm_error,advice", [
    ("sign", "Error: private key not found", "gpg --show-keys secring.gpg"),
    ("sign", "Error: provided key is not a private key. Try providing a keyring with secret keys", "public keys only"),
    ("sign", "Error: too many keys", "more than one key"),
    ("sign", "Error: passphrase: inappropriate ioctl", "SIGN_KEY_PASSPHRASE"),
    ("sign", "Error: something else", "check --sign-key"),
    ("verify", 'Error: failed to fetch provenance "oci://r/ns/charts/reprieve:0.2.0.prov"', "published unsigned"),
    ("verify", "Error: openpgp: signature made by unknown entity", "not in pub.gpg"),
    ("verify", "Error: sha256 sum does not match for chart", "does not match its provenance"),
    ("verify", "Error: whatever", "could not verify"),
])
def test_a_refused_signing_or_verification_says_what_to_do(step: str, helm_error: str, advice: str) -> None:
    assert advice in ADVISE[step](helm_error)


@pytest.mark.parametrize("output,signer", [
    (VERIFY_OUT, {"signer": "Rel <rel@x.invalid>", "fingerprint": FPR}),
    (f"Pulled: r/ns/charts/reprieve:0.2.0\nDigest: {D1}\n", None),  # a pull without --verify
])
def test_the_signer_is_read_from_helms_verify_report(output: str, signer: dict | None) -> None:
    assert plan.signer_of(output) == signer


def test_the_record_says_whether_the_chart_is_signed_and_by_which_key() -> None:
    assert _record()["chart"]["signed"] is False and "fingerprint" not in _record()["chart"]
    signed = plan.record("0.2.0", registry="r", namespace="ns", images={"operator": D1, "example": D2},
                         chart_digest=D1, wheels={}, index_url="i", signer=plan.signer_of(VERIFY_OUT))
    assert signed["chart"] | {"digest": "-"} == {"ref": "oci://r/ns/charts/reprieve", "version": "0.2.0",
                                                "digest": "-", "signed": True, "signer": "Rel <rel@x.invalid>",
                                                "fingerprint": FPR}


@pytest.mark.parametrize("chart,keyring,warns", [
    ({"signed": True, "fingerprint": FPR, "signer": "Rel"}, "", True),
    ({"signed": True, "fingerprint": FPR, "signer": "Rel"}, "pub.gpg", False),
    ({"signed": False}, "", False),
    ({}, "", False),  # a record from before signing
])
def test_installing_a_signed_chart_without_verifying_it_warns(chart: dict, keyring: str, warns: bool) -> None:
    got = plan.unverified_warning({"chart": chart}, keyring)
    assert (got is not None and FPR in got and "--verify-keyring" in got) if warns else got is None
