"""The operator <-> runtime contract has one table of names and defaults (docs/contract.toml); both sides and the
docs are checked against it here, so a name or a default cannot drift on one side only."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
TABLE = tomllib.loads((ROOT / "docs/contract.toml").read_text())
OPERATOR_SETS = set(TABLE["env"]["operator_sets"])
RUNTIME_ONLY = set(TABLE["env"]["runtime_only"])
SUPERVISOR_READS = set(TABLE["env"]["supervisor_reads"])
SUPERVISOR_SETS = set(TABLE["env"]["supervisor_sets"])
SUPERVISOR_KNOBS = set(TABLE["env"]["supervisor_knobs"])
TESTING = set(TABLE["env"]["testing"])
ELSEWHERE = set(TABLE["env"]["elsewhere"])
MEMORY = set(TABLE["memory"]["operator_sets"])  # the memory tier's (tests/runtime/test_memtier_contract.py)
MEMORY_FROM_SUPERVISOR = set(TABLE["memory"]["supervisor_sets"])
ELASTIC = set(TABLE["elastic"]["operator_sets"])  # only for a job with spec.elastic.virtualShards
D = TABLE["defaults"]
CODES = TABLE["restart_exit_code"]


class _Recording(Mapping[str, str]):
    """An environment that records every name the runtime asks for."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values, self.asked = values, set()  # type: set[str]

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.asked.add(key)
        return self.values.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


def _minimal_job() -> Any:
    from reprieve_operator.models import TrainingJob

    return TrainingJob.from_body({
        "apiVersion": "reprieve.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
        "spec": {"replicas": 2, "checkpoint": {"uri": "/ckpt"},
                 "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}},
    })


def test_the_operator_sets_exactly_the_contract_environment() -> None:
    from reprieve_operator.policy.builders import worker_env

    names = {e["name"] for e in worker_env(_minimal_job(), 1, 1)}
    assert names - OPERATOR_SETS == set(), "the operator sets names docs/contract.toml does not list"
    assert OPERATOR_SETS - names == set(), "docs/contract.toml lists names the operator does not set"


@pytest.mark.parametrize("elastic", [None, {"minReplicas": 1}, {"minReplicas": 1, "virtualShards": 8}])
def test_the_operator_sets_the_elastic_variables_exactly_when_virtual_shards_are_declared(
        elastic: dict[str, Any] | None) -> None:
    from reprieve.config import RuntimeConfig
    from reprieve_operator.models import TrainingJob
    from reprieve_operator.policy.builders import worker_env

    body: dict[str, Any] = {
        "apiVersion": "reprieve.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "j", "namespace": "ns"},
        "spec": {"replicas": 2, "checkpoint": {"uri": "/ckpt"}, "restartMode": "InPlace",
                 "template": {"spec": {"containers": [{"name": "t", "image": "i", "command": ["python"]}]}},
                 **({"elastic": elastic} if elastic else {})}}
    env = {e["name"]: e.get("value") for e in worker_env(TrainingJob.from_body(body), 1, 1)}
    declared = bool(elastic and "virtualShards" in elastic)
    assert set(env) - OPERATOR_SETS == (ELASTIC if declared else set())
    shards = RuntimeConfig.from_env({k: v for k, v in env.items() if v is not None}).virtual_shards
    assert shards == (8 if declared else None)  # what the runtime reads is what the spec declared


def test_the_runtime_reads_every_contract_variable_and_no_unlisted_one() -> None:
    from reprieve.checkpoint.layout import Location
    from reprieve.checkpoint.spec import kvstore_spec
    from reprieve.config import RuntimeConfig

    env = _Recording({})
    RuntimeConfig.from_env(env)
    kvstore_spec(Location("s3", "bucket", ""), env=env)  # the checkpoint storage's own variable
    asked = {n for n in env.asked if n.startswith("REPRIEVE_")}
    assert (OPERATOR_SETS | ELASTIC) - SUPERVISOR_READS - asked == set(), \
        "the runtime ignores variables the operator sets"
    assert asked - OPERATOR_SETS - ELASTIC - RUNTIME_ONLY == set(), \
        "the runtime reads variables docs/contract.toml lacks"
    assert RUNTIME_ONLY - asked == set(), "docs/contract.toml lists runtime variables nobody reads"


def test_defaults_agree_on_both_sides() -> None:
    from reprieve.config import RuntimeConfig
    from reprieve_operator.models import RESTART_CODE_MAX, RESTART_CODE_MIN
    from reprieve_operator.policy.builders import NOTICE_FILE, SERVICEACCOUNT_DIR, worker_env

    runtime = RuntimeConfig.from_env({})
    operator = {e["name"]: e.get("value") for e in worker_env(_minimal_job(), 0, 1)}
    sides = {
        "checkpoint_keep": (runtime.checkpoint_keep, int(operator["REPRIEVE_CHECKPOINT_KEEP"])),
        "checkpoint_interval_steps": (runtime.checkpoint_interval_steps,
                                      int(operator["REPRIEVE_CHECKPOINT_INTERVAL_STEPS"])),
        "checkpoint_interval_seconds": (runtime.checkpoint_interval_seconds,
                                        float(operator["REPRIEVE_CHECKPOINT_INTERVAL_SECONDS"])),
        "restart_exit_code": (runtime.restart_exit_code, int(operator["REPRIEVE_RESTART_EXIT_CODE"])),
        "termination_grace_seconds": (runtime.termination_grace_seconds,
                                      float(operator["REPRIEVE_TERMINATION_GRACE_SECONDS"])),
        "notice_file": (D["notice_file"], NOTICE_FILE),  # the runtime has no default: it reads what is set
        "serviceaccount_dir": (runtime.serviceaccount_dir, SERVICEACCOUNT_DIR),
    }
    assert set(sides) == set(D), "a default in docs/contract.toml is not checked here"
    wrong = {k: {"table": D[k], "runtime": r, "operator": o} for k, (r, o) in sides.items() if not D[k] == r == o}
    assert wrong == {}, wrong
    assert (RESTART_CODE_MIN, RESTART_CODE_MAX) == (TABLE["restart_exit_code"]["min"],
                                                    TABLE["restart_exit_code"]["max"])


def test_one_reader_knows_exactly_the_tables_names() -> None:
    """reprieve.env is the one reader of REPRIEVE_* variables: what it may read is what the table lists for the
    runtime's side (the trainer, the supervisor, what the supervisor hands its children, the tests' hooks)."""
    from reprieve import env

    runtime_side = (OPERATOR_SETS | RUNTIME_ONLY | SUPERVISOR_KNOBS | SUPERVISOR_SETS | TESTING | MEMORY
                    | MEMORY_FROM_SUPERVISOR | ELASTIC)
    assert env.READS == runtime_side, {"only in reprieve.env": env.READS - runtime_side,
                                       "only in the table": runtime_side - env.READS}
    assert env.ELSEWHERE == ELSEWHERE
    assert env.SUPERVISOR == SUPERVISOR_KNOBS | SUPERVISOR_READS
    assert (env.MEMORY, env.FROM_SUPERVISOR_MEMORY) == (MEMORY, MEMORY_FROM_SUPERVISOR)
    assert env.ELASTIC == ELASTIC
    assert not env.READS & env.ELSEWHERE


_READ_OUTSIDE_THE_READER = re.compile(r"""(?:environ|env)(?:\.get\(|\[|\.pop\()\s*["']REPRIEVE_""")


def test_no_runtime_module_parses_a_reprieve_variable_itself() -> None:
    """Every REPRIEVE_* name the runtime's source mentions is one the reader knows, and no module but
    reprieve/env.py looks one up by its literal name (os.environ.get("REPRIEVE_...") and the like)."""
    from reprieve import env

    unknown, direct = {}, []
    for path in sorted((ROOT / "runtime/reprieve").rglob("*.py")):
        text = path.read_text()
        names = set(re.findall(r"\bREPRIEVE_[A-Z0-9_]*[A-Z0-9]\b", text))
        known = env.READS | (env.ELSEWHERE if path.name == "env.py" else frozenset())
        if names - known:
            unknown[path.name] = sorted(names - known)
        if path.name != "env.py" and _READ_OUTSIDE_THE_READER.search(text):
            direct.append(path.name)
    assert unknown == {}, "runtime modules mention REPRIEVE_* names reprieve.env does not know"
    assert direct == [], "these modules read REPRIEVE_* variables themselves instead of through reprieve.env.Env"


def test_every_reprieve_name_in_the_tree_is_listed() -> None:
    """So a name the table lacks cannot be mistaken for a misspelling (nor a misspelling for a name)."""
    listed = (OPERATOR_SETS | RUNTIME_ONLY | SUPERVISOR_KNOBS | SUPERVISOR_SETS | TESTING | ELSEWHERE | MEMORY
              | MEMORY_FROM_SUPERVISOR | ELASTIC)
    found: dict[str, str] = {}
    for pattern in ("runtime/**/*.py", "operator/**/*.py", "hack/**/*.py", "hack/*.sh", "tests/**/*.py",
                    "examples/*", "charts/**/*.yaml", "Makefile", "docs/*.md"):
        for path in ROOT.glob(pattern):
            if path.is_file() and path.name != "test_env.py":  # that one holds misspellings on purpose
                for name in re.findall(r"\bREPRIEVE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")):
                    found.setdefault(name, str(path.relative_to(ROOT)))
    # docs/runtime.md shows the warning for the first, test_console.py provokes it with the second
    misspelt_on_purpose = {"REPRIEVE_CHECKPOINT_INTERVAL", "REPRIEVE_CHECKPOINT_INTERVL_STEPS"}
    missing = {n: where for n, where in found.items() if n not in listed | misspelt_on_purpose}
    assert missing == {}, "REPRIEVE_* names used in the tree but missing from docs/contract.toml"
    assert not misspelt_on_purpose & listed


@pytest.mark.parametrize("code", sorted({0, 1, 2, CODES["min"] - 1, CODES["min"], 42, CODES["max"], CODES["max"] + 1,
                                         126, 127, 134, 137, 143, 255}))
def test_the_runtime_and_the_crd_accept_the_same_restart_codes(code: int) -> None:
    """Both halves against the table: a code the CRD refuses is a ConfigError for the runtime, and the reverse."""
    from pydantic import ValidationError
    from reprieve.config import ConfigError, RuntimeConfig
    from reprieve_operator.models import RestartPolicySpec

    in_table = CODES["min"] <= code <= CODES["max"]
    try:
        RuntimeConfig.from_env({"REPRIEVE_RESTART_EXIT_CODE": str(code)})
        runtime_accepts = True
    except ConfigError as err:
        runtime_accepts = False
        assert f"must be between {CODES['min']} and {CODES['max']}" in str(err)
    try:
        RestartPolicySpec.model_validate({"restartExitCode": code})
        operator_accepts = True
    except ValidationError:
        operator_accepts = False
    assert (runtime_accepts, operator_accepts) == (in_table, in_table)


def test_annotation_and_label_names_agree() -> None:
    import reprieve_operator as op
    from reprieve import notice

    a, lab = TABLE["annotations"], TABLE["labels"]
    assert (op.ANNOTATION_NOTICE, notice.NOTICE_ANNOTATION) == (a["notice"], a["notice"])
    assert (op.ANNOTATION_PROGRESS, notice.PROGRESS_ANNOTATION) == (a["progress"], a["progress"])
    assert (op.LABEL_JOB, op.LABEL_INDEX, op.LABEL_ATTEMPT) == (lab["job"], lab["index"], lab["attempt"])
    assert op.LABEL_ROLE == lab["role"]
    assert (op.ANNOTATION_NOTICE_WATCH, notice.NOTICE_WATCH_ANNOTATION) == (a["notice_watch"], a["notice_watch"])


def test_the_job_notice_object_the_operator_writes_is_the_one_the_runtime_watches() -> None:
    """Operator writes -> runtime reads: ``builders.build_notice_object`` is named as ``reprieve.notice_object``
    watches it, its data key is the one read, the worker Role grants exactly get/list/watch on it by name, and a pod
    that says it watches it (the runtime's declaration) is one the operator's routing counts as watching."""
    import reprieve_operator as op
    from reprieve import notice
    from reprieve.notice_object import declaration, notice_object_name
    from reprieve_operator.policy import builders, fanout

    c = TABLE["contract"]
    assert (op.NOTICE_OBJECT_SUFFIX, notice.NOTICE_OBJECT_SUFFIX) == (c["notice_suffix"], c["notice_suffix"])
    assert (op.NOTICE_OBJECT_KEY, notice.NOTICE_OBJECT_KEY) == (c["notice_key"], c["notice_key"])
    job = _minimal_job()
    cm = builders.build_notice_object(job, '{"id": "x"}')
    assert cm["metadata"]["name"] == notice_object_name(job.name) and cm["data"] == {notice.NOTICE_OBJECT_KEY: '{"id": "x"}'}
    rules = builders.worker_role(job)["rules"]
    assert {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [cm["metadata"]["name"]],
            "verbs": ["get", "list", "watch"]} in rules
    name = cm["metadata"]["name"]
    for refused, watching in ((None, True), (403, False), (429, False)):
        pod = {"metadata": {"annotations": {notice.NOTICE_WATCH_ANNOTATION: declaration(name, refused)}}}
        assert fanout.watches(pod, name) is watching


def test_the_supervisor_speaks_the_operators_contract() -> None:
    import reprieve_operator as op
    from reprieve.supervisor import contract

    c, a = TABLE["contract"], TABLE["annotations"]
    assert op.CONTRACT_VERSION == contract.CONTRACT_VERSION == c["version"]
    assert contract.ASSIGNMENT_SUFFIX == c["assignment_suffix"]
    assert (op.ANNOTATION_EXIT, contract.EXIT_ANNOTATION) == (a["exit"], a["exit"])
    assert (op.ANNOTATION_SUPERVISOR, contract.SUPERVISOR_ANNOTATION) == (a["supervisor"], a["supervisor"])
    assert {contract.CONTRACT_ENV} == SUPERVISOR_READS
    assert {contract.SUPERVISED_ENV, contract.WARM_FD_ENV, contract.EVENTS_FD_ENV,
            contract.EXPECTED_TOPOLOGY_ENV, contract.LANDING_BYTES_ENV, contract.OWNED_BYTES_ENV} == SUPERVISOR_SETS


def test_the_assignment_the_operator_writes_is_what_each_process_runs() -> None:
    """Operator writes -> runtime reads: ``builders.build_assignment`` (the ConfigMap) through reprieve-supervisor's parser,
    the trainer's environment and ``RuntimeConfig``, and through the line a warm process reads; the ConfigMap's
    name is the one reprieve-supervisor watches; a pod the assignment does not list runs nothing."""
    from reprieve.config import RuntimeConfig
    from reprieve.supervisor import contract
    from reprieve_operator.policy import builders

    job = _minimal_job()
    cm = builders.build_assignment(job, 3, {"j-0": 0, "j-spare-x1": 1}, "j-0.j.ns.svc:8476",
                                   {0: "j-spare-x1.j.ns.svc:8477", 1: None})
    assert cm["metadata"]["name"] == f"{job.name}{contract.ASSIGNMENT_SUFFIX}"  # what reprieve-supervisor watches
    assert contract.contract_problem(cm["data"]["contract"], where="the ConfigMap") is None
    where = f"{job.namespace}/{cm['metadata']['name']}"
    for pod, index, peer in [("j-0", 0, "j-spare-x1.j.ns.svc:8477"), ("j-spare-x1", 1, "")]:
        a = contract.parse_assignment(cm["data"], pod, configmap=where)
        assert (a.attempt, a.process_id, a.num_processes, a.coordinator, a.memory_peer) == (
            3, index, 2, "j-0.j.ns.svc:8476", peer)
        base = {e["name"]: e["value"] for e in builders.worker_env(job, 0, 1) if "value" in e}
        config = RuntimeConfig.from_env(contract.trainer_env(base, a))
        assert (config.attempt, config.process_id, config.num_processes, config.coordinator_address) == (
            3, index, 2, "j-0.j.ns.svc:8476")
        assert contract.parse_assignment_line(a.line()) == a.env()  # a warm process takes the same identity
    assert not contract.parse_assignment(cm["data"], "j-1", configmap=where).listed  # not listed: runs nothing


def test_a_grows_assignment_tells_each_supervisor_to_stop_its_trainer_with_the_resize_signal() -> None:
    """Operator writes -> supervisor reads -> runtime takes: the grow's ConfigMap key and value, the signal and the
    notice's reason, each as ``docs/contract.toml`` [elastic] names them."""
    import reprieve_operator as op
    from reprieve.notice import RESIZE_REASON
    from reprieve.supervisor import contract
    from reprieve_operator.policy import builders

    e = TABLE["elastic"]
    assert (op.ASSIGNMENT_RESIZE_KEY, contract.RESIZE_KEY) == (e["assignment_key"], e["assignment_key"])
    assert (op.RESIZE_GROW, contract.RESIZE_GROW) == (e["grow"], e["grow"])
    assert (contract.RESIZE_SIGNAL.name, RESIZE_REASON) == (e["resize_signal"], e["notice_reason"])
    job = _minimal_job()
    for resize in (None, op.RESIZE_GROW):
        cm = builders.build_assignment(job, 3, {"j-0": 0, "j-1": 1}, "j-0.j.ns.svc:8476", resize=resize)
        assert contract.parse_assignment(cm["data"], "j-1", configmap="ns/j-assignment").resize == resize


@pytest.mark.parametrize("code,agreed", [(0, None), (1, None), (42, True), (42, False), (137, None)])
def test_the_exit_reprieve_run_reports_is_what_the_operator_reads(code: int, agreed: bool | None) -> None:
    """Runtime writes -> operator reads: reprieve-supervisor's ``reprieve.dev/exit`` and ``reprieve.dev/supervisor``
    annotations on a pod the operator built, through the cache's compact pod to the policy's view of it."""
    from datetime import UTC, datetime

    from reprieve.supervisor import contract
    from reprieve_operator.policy import builders
    from reprieve_operator.policy.views import compact_pod, pod_view

    now = 1_764_000_000.0
    pod = builders.build_worker_pod(_minimal_job(), 1, 2)
    pod["metadata"]["annotations"] = {**pod["metadata"].get("annotations", {}),
                                      **contract.exit_annotation(2, code, now, agreed),
                                      **contract.supervisor_annotation("9.9.9")}
    view = pod_view(compact_pod(pod))
    assert view is not None
    assert (view.exit_attempt, view.exit_code, view.exit_agreed, view.exit_time, view.contract) == (
        2, code, agreed, datetime.fromtimestamp(now, UTC), contract.CONTRACT_VERSION)


def test_the_last_step_a_survivor_leaves_is_what_the_operator_folds(tmp_path: Path) -> None:
    """Runtime writes -> operator reads: the last step a process that outlived a lost peer said, in its
    supervisor's exit report (in place) and in its termination message (Recreate), through the cache's compact
    pod to ``views.last_steps`` (docs/contract.md)."""
    from reprieve.peers import write_termination_message
    from reprieve.supervisor import contract
    from reprieve_operator.policy import builders
    from reprieve_operator.policy.views import compact_pod, last_steps

    in_place = builders.build_worker_pod(_minimal_job(), 1, 2)
    in_place["metadata"]["annotations"] = {**in_place["metadata"].get("annotations", {}),
                                           **contract.exit_annotation(2, 134, 1_764_000_000.0, None, (0,),
                                                                      (412, 1_764_000_054.25))}
    log = tmp_path / "termination-log"
    log.touch()
    write_termination_message((0,), str(log), attempt=3, last=(97, 1_764_000_100.5))
    recreate = builders.build_worker_pod(_minimal_job(), 1, 3)
    recreate["status"] = {"phase": "Failed", "containerStatuses": [
        {"name": "trainer", "state": {"terminated": {"exitCode": 134, "message": log.read_text()}}}]}
    assert last_steps([compact_pod(in_place), compact_pod(recreate)]) == (
        (2, 412, 1_764_000_054.25), (3, 97, 1_764_000_100.5))


def test_the_docs_list_the_same_environment() -> None:
    text = (ROOT / "docs/contract.md").read_text()
    section = text.split("### Environment of every worker container", 1)[1].split("\n#", 1)[0]
    documented = set(re.findall(r"`(REPRIEVE_[A-Z_]+)`", section))
    assert documented == OPERATOR_SETS, {"only in docs": documented - OPERATOR_SETS,
                                         "only in the table": OPERATOR_SETS - documented}
    elastic = text.split("## Elastic jobs", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"`(REPRIEVE_[A-Z_]+)`", elastic)) >= ELASTIC
    runtime_doc = (ROOT / "docs/runtime.md").read_text()
    missing = {n for n in RUNTIME_ONLY | SUPERVISOR_KNOBS if f"`{n}`" not in runtime_doc}
    assert missing == set(), f"docs/runtime.md does not document {sorted(missing)}"


def test_the_crd_default_is_the_table_default() -> None:
    import yaml

    crd = yaml.safe_load((ROOT / "crds/reprieve.dev_trainingjobs.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    ckpt = spec["checkpoint"]["properties"]
    assert ckpt["keep"]["default"] == D["checkpoint_keep"]
    assert ckpt["intervalSteps"]["default"] == D["checkpoint_interval_steps"]
    assert spec["restartPolicy"]["properties"]["restartExitCode"]["default"] == D["restart_exit_code"]
    assert spec["terminationGracePeriodSeconds"]["default"] == D["termination_grace_seconds"]


def test_the_operator_knows_exactly_the_contracts_restore_tiers_and_sources() -> None:
    """``restoredFrom.tier`` and ``restoredFrom.sources[i]`` (docs/contract.toml ``[memory]``): the operator's one
    table of them (``policy.restores``), in the table's order (the Restored Event lists sources in it), and the docs'
    section; a name outside it is kept as ``unknown``, which must never be a name of the contract."""
    from reprieve_operator.policy import restores

    assert list(restores.TIERS) == TABLE["memory"]["restore_tiers"]
    assert list(restores.SOURCES) == TABLE["memory"]["restore_sources"]
    assert restores.UNKNOWN not in (*restores.TIERS, *restores.SOURCES)
    section = (ROOT / "docs/contract.md").read_text().split("## Memory tier", 1)[1].split("\n## ", 1)[0]
    assert [w for w in (*restores.TIERS, *restores.SOURCES) if f'"{w}"' not in section] == []
    assert f"`{restores.UNKNOWN}`" in section  # what happens to a name outside the table is said there


def test_the_loss_rate_is_written_and_read_under_the_contracts_assignment_key() -> None:
    """``lossEverySeconds`` (docs/contract.toml ``[memory] assignment_loss_key``): the operator's name for the key it
    writes and reprieve-supervisor's for the key it reads."""
    import reprieve_operator as op
    from reprieve.supervisor import contract

    key = TABLE["memory"]["assignment_loss_key"]
    assert (op.ASSIGNMENT_LOSS_EVERY_KEY, contract.LOSS_EVERY_KEY) == (key, key)
