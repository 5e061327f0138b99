"""TrainingJob spec and status: the single source of truth for the CRD schema (see ``crdgen``).

Field names are snake_case in Python and camelCase on the wire (``alias_generator``); unknown fields are
rejected (``extra="forbid"``). Extra OpenAPI/CEL keywords ride along in ``json_schema_extra`` and are copied
verbatim into the CRD by ``crdgen``.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

# the enums of built-in signal names and of a custom signal's kinds, from their one table each
from .policy.signalkinds import BUILTIN_SIGNAL_NAMES, CUSTOM_KINDS

KUEUE_NOTICE = "kueue-preemption"  # a Kueue eviction's notice: its key in preemption.noticeSeconds (docs/kueue.md)
MAX_REPLICAS = 10_000  # a gang of up to 10,000 pods (see TrainingJobSpec.replicas)

GROUP = "reprieve.dev"
VERSION = "v1alpha1"
KIND = "TrainingJob"
PLURAL = "trainingjobs"
SINGULAR = "trainingjob"
SHORT_NAMES = ["tj"]

# A DNS-1123 label short enough that "<name>-<index>" and "<name>-worker" stay valid names.
JOB_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,40}[a-z0-9])?$")
CHECKPOINT_URI_RULE = (
    "!self.contains('://') || self.startsWith('file://') || self.startsWith('gs://') "
    "|| self.startsWith('s3://')"
)


def _immutable(field: str) -> dict[str, Any]:
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": f"{field} is immutable"}]}


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def _interval(limit: int, description: str) -> Any:
    """A save interval field (storage or memory tier): 0 by default, at most ``limit``."""
    return Field(default=0, ge=0, le=limit, description=description)


QUANTITY_RE = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_QUANTITY_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                   "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
MAX_INTERVAL_STEPS = 10_000_000  # a save interval's bounds (storage and memory tier alike)
MAX_INTERVAL_SECONDS = 604_800  # a week
MEMORY_MIN_BYTES = 2**20  # a memory volume below 1 MiB is a typo, not a choice
MAX_LOSS_EVERY_SECONDS = 31_536_000  # a year
MEMORY_RULES = [
    {"rule": "self.intervalSteps == 0 || self.intervalSeconds == 0", "fieldPath": ".intervalSeconds",
     "message": "spec.checkpoint.memory: give intervalSteps or intervalSeconds, not both (neither: memory saves "
                "are spaced to cost at most 1 % of the training time)"},
    {"rule": "self.lossEverySeconds == 0 || (self.intervalSteps == 0 && self.intervalSeconds == 0)",
     "fieldPath": ".lossEverySeconds",
     "message": "spec.checkpoint.memory: lossEverySeconds spaces memory saves only when no interval is given: "
                "unset intervalSteps and intervalSeconds, or lossEverySeconds"},
]


def quantity_bytes(value: str) -> int:
    """A Kubernetes memory quantity in plain bytes (integers with a binary or decimal suffix; pure)."""
    m = QUANTITY_RE.match(value)
    if m is None:
        raise ValueError(f"must be a memory quantity such as 8Gi or 500Mi, got {value!r}")
    return int(m.group(1)) * _QUANTITY_UNITS[m.group(2)]


class MemorySpec(_Model):
    """The memory tier (docs/memory.md): every process keeps a copy of its shards in a memory-backed volume of its
    pod and sends it to a peer pod on another node; a node lost without notice then costs the steps since the
    last memory save, not since the last storage checkpoint. Storage checkpoints go on as configured."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              json_schema_extra={"x-kubernetes-validations": MEMORY_RULES})  # type: ignore[dict-item]

    enabled: bool = Field(default=True, description="Turn the memory tier off without removing its settings.")
    size_limit: str = Field(
        max_length=32, pattern=QUANTITY_RE.pattern,
        description="sizeLimit of each worker pod's memory volume (an emptyDir with medium Memory; it counts "
                    "against the pod's memory limit). It must hold 3 copies of one process's shards: its own, "
                    "its peer's and one in flight; a smaller one turns the tier off at the first save with the "
                    "sizes in the log, and the job trains on with storage checkpoints.")
    interval_steps: int = _interval(
        MAX_INTERVAL_STEPS,
        "Memory save every this many steps; 0 with intervalSeconds 0: spaced to cost at most 1 % of the training "
        "time (measured at the start of each attempt).")
    interval_seconds: int = _interval(MAX_INTERVAL_SECONDS,
                                      "Memory save about every this many seconds of training (0: off).")
    loss_every_seconds: int = Field(
        default=0, ge=0, le=MAX_LOSS_EVERY_SECONDS,
        description="How often the job loses a worker without notice (a machine, a pod, a partition): the mean "
                    "seconds of training between such losses anywhere in the job (one node's mean time between "
                    "failures divided by the job's nodes). With no interval given, memory saves are then spaced "
                    "for the fewest seconds lost to saves and losses together (Young/Daly: about the square root "
                    "of 2 x a save's cost x this) where that is closer than the 1 % budget's. 0: not known (from the job's first "
                    "loss without notice on, the operator then passes the rate the job has met).")

    @field_validator("size_limit")
    @classmethod
    def _size(cls, v: str) -> str:
        try:
            size = quantity_bytes(v)
        except ValueError as err:
            raise ValueError(f"spec.checkpoint.memory.sizeLimit {err}") from None
        if size < MEMORY_MIN_BYTES:
            raise ValueError(f"spec.checkpoint.memory.sizeLimit must be at least 1Mi, got {v!r}")
        return v

    @model_validator(mode="after")
    def _one_interval(self) -> MemorySpec:
        if self.interval_steps and self.interval_seconds:
            raise ValueError(MEMORY_RULES[0]["message"])
        if self.loss_every_seconds and (self.interval_steps or self.interval_seconds):
            raise ValueError(MEMORY_RULES[1]["message"])
        return self

    @property
    def limit_bytes(self) -> int:
        return quantity_bytes(self.size_limit)


class CheckpointSpec(_Model):
    """Where and how often the runtime saves (passed to the workers as environment variables)."""

    uri: str = Field(
        min_length=1,
        max_length=1024,
        description="Checkpoint location: a path, file://, gs:// or s3:// URI. Immutable.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": CHECKPOINT_URI_RULE,
                 "message": "checkpoint.uri scheme must be file://, gs:// or s3:// (or a plain path)"},
                {"rule": "self == oldSelf", "message": "checkpoint.uri is immutable"},
            ]
        },
    )
    interval_steps: int = _interval(
        MAX_INTERVAL_STEPS,
        "Periodic save interval in steps; 0 saves only on a preemption notice. An edit takes effect at the next "
        "attempt (running workers keep the value they started with).")
    interval_seconds: int = _interval(
        MAX_INTERVAL_SECONDS,
        "Periodic save at most every this many seconds (beside intervalSteps; 0: off). An edit takes effect at "
        "the next attempt.")
    keep: int = Field(default=3, ge=1, le=1000,
                      description="How many complete checkpoints to keep. An edit takes effect at the next attempt.")
    memory: MemorySpec | None = Field(
        default=None,
        description="The memory tier (restartMode InPlace only): a copy of every process's state in its pod's "
                    "memory and a peer pod's, restored from the nearest complete copy. An edit takes effect at "
                    "the next attempt.")

    @field_validator("uri")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if "://" in v and not v.startswith(("file://", "gs://", "s3://")):
            raise ValueError(f"checkpoint.uri scheme must be file://, gs:// or s3:// (or a plain path), got {v!r}")
        return v


# Exit codes a restart code must not collide with: 0 success; 1 the runtime's "deadline missed, not saved" (and
# Python's uncaught exception); 2 Python's usage error ("can't open file"); 126/127 the shell's "cannot
# execute"/"not found"; 128+N death by signal N (137 SIGKILL or OOM kill, 143 SIGTERM, 134 SIGABRT).
RESTART_CODE_MIN, RESTART_CODE_MAX = 3, 125
RESTART_CODE_MESSAGE = (
    "restartPolicy.restartExitCode must be between 3 and 125: 0 means success, 1 the runtime's 'deadline missed, "
    "not saved' (and any Python crash), 2 Python's usage error, 126-127 'cannot execute', and 128+N death by "
    "signal N (137 SIGKILL/OOM, 143 SIGTERM): a crash must never count as a saved preemption")


class ExitCodeAction(str, Enum):
    FAIL_JOB = "FailJob"
    IGNORE = "Ignore"
    COUNT = "Count"


class ExitCodeOperator(str, Enum):
    IN = "In"
    NOT_IN = "NotIn"


class OnExitCodes(_Model):
    """Which exit codes a rule matches."""

    operator: ExitCodeOperator = Field(description="In: the codes listed; NotIn: every other failing code.")
    values: list[int] = Field(
        min_length=1, max_length=255,
        description="Exit codes 1-255 (128+N: killed by signal N, e.g. 137 = SIGKILL).",
        json_schema_extra={"items": {"type": "integer", "minimum": 1, "maximum": 255}})


class ExitCodeRule(_Model):
    """How a worker's failing exit code is counted (docs/exit-codes.md); the first match decides."""

    action: ExitCodeAction = Field(
        description="FailJob: fail the job at once (no retry can help); Ignore: restart the gang counted as a "
                    "disruption, not a failure (an infrastructure kill); Count: a failure, as without rules.")
    on_exit_codes: OnExitCodes = Field(description="The exit codes the rule matches.")


EXIT_CODE_RULES_RULE = {
    "rule": "!has(self.exitCodeRules) || self.exitCodeRules.all(r, r.onExitCodes.operator != 'In' || "
            "!(self.restartExitCode in r.onExitCodes.values))",
    "fieldPath": ".exitCodeRules",
    "message": "restartPolicy.exitCodeRules: the restart exit code is a saved preemption, never a failure; "
               "remove it from the rule's onExitCodes.values"}


class RestartPolicySpec(_Model):
    """How exits are counted: the restart code is a saved preemption; any other is a failure, or as a rule says."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              json_schema_extra={"x-kubernetes-validations": [EXIT_CODE_RULES_RULE]})  # type: ignore[list-item]

    restart_exit_code: int = Field(
        default=42,
        description="Exit code meaning 'state saved, restart me': 3-125, so that it cannot collide with a crash "
                    "(1, 2), the shell (126, 127) or a signal (128+N). Immutable.",
        json_schema_extra={"x-kubernetes-validations": [
            {"rule": f"self >= {RESTART_CODE_MIN} && self <= {RESTART_CODE_MAX}", "message": RESTART_CODE_MESSAGE},
            {"rule": "self == oldSelf", "message": "restartPolicy.restartExitCode is immutable (running pods "
                                                   "were given the old code)"},
        ]},
    )
    max_failures: int = Field(
        default=3, ge=0, le=1000,
        description="Gang restarts allowed after failures (non-zero, non-restart exits); one more fails the job.")
    max_preemption_restarts: int | None = Field(
        default=None, ge=0, le=100_000,
        description="Optional cap on restarts caused by preemptions and disruptions; unset means unlimited.")
    max_rapid_restarts: int = Field(
        default=5, ge=0, le=1000,
        description="Consecutive rapid restarts allowed (every worker exited with the restart code within "
                    "60 s of the attempt's start, without any notice or lost pod): each waits an exponential "
                    "backoff (10 s doubling to 5 min) before the next attempt; one more fails the job "
                    "(TooManyRapidRestarts).")
    exit_code_rules: list[ExitCodeRule] = Field(
        default_factory=list, max_length=20,
        description="How failing exit codes are counted, first match wins (like a Job's podFailurePolicy): "
                    "e.g. {action: Ignore, onExitCodes: {operator: In, values: [137]}} restarts after a SIGKILL "
                    "without spending maxFailures; {action: FailJob, ...} fails the job at once. A worker that "
                    "ended because it lost a peer is judged by the loss, not by its code.")

    @field_validator("restart_exit_code")
    @classmethod
    def _code(cls, v: int) -> int:
        if not RESTART_CODE_MIN <= v <= RESTART_CODE_MAX:
            raise ValueError(f"{RESTART_CODE_MESSAGE}; got {v}")
        return v

    @model_validator(mode="after")
    def _rules(self) -> RestartPolicySpec:
        for i, rule in enumerate(self.exit_code_rules):
            bad = [c for c in rule.on_exit_codes.values if not 1 <= c <= 255]
            if bad:
                raise ValueError(f"restartPolicy.exitCodeRules[{i}].onExitCodes.values: {bad} are not exit codes "
                                 "1-255")
            if rule.on_exit_codes.operator == ExitCodeOperator.IN and self.restart_exit_code in \
                    rule.on_exit_codes.values:
                raise ValueError(EXIT_CODE_RULES_RULE["message"].replace("the rule's", f"rule {i}'s"))
        return self


class CustomSignal(_Model):
    """A site-specific node signal: a taint key, a label (optionally with a value) or a condition type."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                      description="Reason reported in the notice.")
    type: Literal[CUSTOM_KINDS] = Field(  # type: ignore[valid-type]
        description=f"{', '.join(CUSTOM_KINDS[:-1])} or {CUSTOM_KINDS[-1]}.")
    key: str = Field(min_length=1, max_length=316, description="Taint key, label key or condition type.")
    value: str | None = Field(
        default=None, max_length=256,
        description="Required value (label value, taint value; condition status, default 'True').")
    notice_seconds: int | None = Field(
        default=None, ge=0, le=86_400,
        description="Expected time from signal to node loss; defaults to preemption.defaultNoticeSeconds.")


class PreemptionSpec(_Model):
    """Which node signals warn this job and how much notice each one gives."""

    enabled: bool = Field(default=True, description="Deliver notices to this job at all. Edits to preemption "
                                                    "apply at once (to the next node event).")
    signals: list[Literal[BUILTIN_SIGNAL_NAMES]] | None = Field(  # type: ignore[valid-type]
        default=None, max_length=len(BUILTIN_SIGNAL_NAMES),
        description="Built-in signals that count (default: all enabled in the operator's signal table).")
    notice_seconds: dict[str, int] = Field(
        default_factory=dict,
        description="Per-signal notice window overrides in seconds, by signal name (kueue-preemption: the "
                    "window a Kueue eviction gives the gang to save, default 60).",
        json_schema_extra={"x-kubernetes-validations": [
            {"rule": "self.all(k, self[k] >= 0 && self[k] <= 86400)",
             "message": "preemption.noticeSeconds values must be between 0 and 86400"}]},
    )
    default_notice_seconds: int = Field(
        default=30, ge=0, le=86_400,
        description="Notice window for custom signals that name none.")
    custom: list[CustomSignal] = Field(default_factory=list, max_length=32,
                                       description="Additional site-specific signals.")


TEMPLATE_SCHEMA: dict[str, Any] = {
    "x-reprieve-embed": "PodTemplateSpec",  # crdgen adds Kubernetes' PodSpec schema under spec (docs, types)
    "type": "object",
    "description": "Pod template of the trainer (a PodTemplateSpec). Immutable.",
    "required": ["spec"],
    "properties": {
        "metadata": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "spec": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "required": ["containers"],
            "properties": {
                "containers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "x-kubernetes-preserve-unknown-fields": True,
                        "properties": {"name": {"type": "string", "minLength": 1}},
                    },
                },
                "restartPolicy": {
                    "type": "string",
                    "enum": ["Never"],
                    "description": "Only Never: restarts are the operator's, always of the whole gang.",
                },
            },
        },
    },
    "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "template is immutable"}],
}


class ServiceAccountSpec(_Model):
    """The worker ServiceAccount the operator creates (``<job>-worker``) when the template names none."""

    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Annotations of the created ServiceAccount, e.g. iam.gke.io/gcp-service-account (GKE Workload "
                    "Identity) or eks.amazonaws.com/role-arn (EKS IRSA). Applied again at every attempt.")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels of the created ServiceAccount.")


# Defaults of spec.elastic (docs/elastic-operator.md, "The spec"): the wait for a replacement before shrinking,
ELASTIC_UNSCHEDULABLE_SECONDS = 60
ELASTIC_RESIZE_INTERVAL_SECONDS = 300  # and the least time between size changes before a grow
MAX_VIRTUAL_SHARDS = 1_000_000
ELASTIC_RULES = [
    {"rule": "has(self.virtualShards) == has(oldSelf.virtualShards) && (!has(self.virtualShards) || "
             "self.virtualShards == oldSelf.virtualShards)", "fieldPath": ".virtualShards",
     "message": "spec.elastic.virtualShards is immutable (the checkpoint keeps one data position per virtual "
                "shard; the count is fixed for the run)"},
]


class ElasticSpec(_Model):
    """Elastic training (docs/elastic-operator.md, "The spec"): when a lost worker's replacement cannot be
    scheduled, train on the survivors instead of waiting, and grow back when capacity returns. Without it a job
    waits for its full size, as before."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              json_schema_extra={"x-kubernetes-validations": ELASTIC_RULES})  # type: ignore[dict-item]

    min_replicas: int = Field(
        ge=1, le=MAX_REPLICAS,
        description="The fewest workers the job may train on (1..replicas). Below it the job waits for capacity, "
                    "as without this block, with condition Degraded saying why.")
    unschedulable_seconds: int = Field(
        default=ELASTIC_UNSCHEDULABLE_SECONDS, ge=0, le=86_400,
        description="How long a lost worker's replacement may stay unschedulable (the scheduler's "
                    "PodScheduled=False/Unschedulable) before the job shrinks to the survivors instead of "
                    "waiting. Default 60: longer than the few seconds a restart's pods wait for a node that has "
                    "room, shorter than a cluster autoscaler's scale-up (minutes).")
    grow_back: bool = Field(
        default=True,
        description="Grow back towards replicas when capacity returns (a replacement or spare pod is ready).")
    min_resize_interval_seconds: int = Field(
        default=ELASTIC_RESIZE_INTERVAL_SECONDS, ge=0, le=86_400,
        description="The least time between two size changes before a grow: capacity that comes and goes "
                    "restarts the job at most once per interval. A shrink follows a loss that has stopped the "
                    "gang already and is never delayed by it.")
    virtual_shards: int | None = Field(
        default=None, ge=1, le=MAX_VIRTUAL_SHARDS,
        description="The job's virtual data-parallel shards (reprieve.VirtualStep): a multiple of replicas; the "
                    "job only takes sizes that divide it (e.g. 8 shards: 8, 4, 2 or 1 workers). Unset: every "
                    "size from minReplicas to replicas. Immutable.")


MEMORY_NEEDS_INPLACE = (
    "spec.checkpoint.memory needs restartMode InPlace: with Recreate no pod survives a restart, so no memory copy "
    "does (docs/memory.md, \"Recreate mode\"); set restartMode: InPlace and the first container's command, or "
    "remove spec.checkpoint.memory")
ELASTIC_NEEDS_INPLACE = (
    "spec.elastic needs restartMode InPlace: a shrink or a grow keeps the survivors' pods and restarts their "
    "processes in place (with Recreate every pod is created again and the job waits for all of them); set "
    "restartMode: InPlace and the first container's command, or remove spec.elastic")
# CEL: the restart mode in effect is InPlace (restartMode, else its default: InPlace when the command is set)
IN_PLACE_CEL = "(has(self.restartMode) ? self.restartMode == 'InPlace' : has(self.template.spec.containers[0].command))"
SPEC_RULES = [
    {"rule": "self.spares <= self.replicas", "fieldPath": ".spares",
     "message": "spares must be at most replicas (a spare replaces one worker; more would never be used)"},
    {"rule": f"self.spares == 0 || {IN_PLACE_CEL}", "fieldPath": ".spares",
     "message": "spares need restartMode InPlace (with Recreate every pod is created again anyway); InPlace is the "
                "default only when the first container sets its command"},
    {"rule": "!has(self.restartMode) || self.restartMode != 'InPlace' || "
             "has(self.template.spec.containers[0].command)",
     "fieldPath": ".template",
     "message": "restartMode InPlace runs the first container under reprieve-supervisor, so its command must be set "
                "(the image's entrypoint cannot be wrapped); set the command, or restartMode: Recreate"},
    {"rule": f"!has(self.checkpoint.memory) || !self.checkpoint.memory.enabled || {IN_PLACE_CEL}",
     "fieldPath": ".checkpoint.memory", "message": MEMORY_NEEDS_INPLACE},
    {"rule": "!has(self.elastic) || self.elastic.minReplicas <= self.replicas", "fieldPath": ".elastic.minReplicas",
     "message": "spec.elastic.minReplicas must be at most spec.replicas (the fewest workers the job may train on)"},
    {"rule": "!has(self.elastic) || !has(self.elastic.virtualShards) || self.elastic.virtualShards % self.replicas "
             "== 0", "fieldPath": ".elastic.virtualShards",
     "message": "spec.elastic.virtualShards must be a multiple of spec.replicas (the full size must split the "
                "shards evenly)"},
    {"rule": f"!has(self.elastic) || {IN_PLACE_CEL}", "fieldPath": ".elastic", "message": ELASTIC_NEEDS_INPLACE},
    {"rule": "has(oldSelf.restartMode) == has(self.restartMode)", "fieldPath": ".restartMode",
     "message": "restartMode is immutable (it cannot be set or removed after creation: the default is decided "
                "at creation)"},
]


class TrainingJobSpec(_Model):
    """Desired state of a gang of JAX workers that survives node preemption."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              json_schema_extra={"x-kubernetes-validations": SPEC_RULES})  # type: ignore[dict-item]

    # 10,000: the assignment ConfigMap and the worker Role list every pod name; with names of up to 63 characters
    # both stay well under the API server's 1 MiB object limit (~0.7 MiB at 10,000).
    replicas: int = Field(ge=1, le=MAX_REPLICAS, description="Number of worker processes (pods). Immutable.",
                          json_schema_extra=_immutable("replicas"))
    template: dict[str, Any] = Field(description="Pod template of the trainer (a PodTemplateSpec). Immutable.",
                                     json_schema_extra={"crd": TEMPLATE_SCHEMA})
    checkpoint: CheckpointSpec
    # `default: {}` in the CRD lets the API server fill in the nested defaults when the object is omitted.
    restart_policy: RestartPolicySpec = Field(default_factory=RestartPolicySpec,
                                              json_schema_extra={"default": {}})
    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec, json_schema_extra={"default": {}})
    termination_grace_period_seconds: int = Field(
        default=30, ge=0, le=3600,
        description="SIGTERM-to-SIGKILL grace of the worker pods (the runtime's last-resort save window). An "
                    "edit takes effect at the next attempt (a running pod's grace cannot change).")
    coordinator_port: int = Field(default=8476, ge=1024, le=65535,
                                  description="Port of process 0's JAX coordination service. Immutable.",
                                  json_schema_extra=_immutable("coordinatorPort"))
    suspend: bool = Field(default=False, description="Delete the workers but keep the job; resume later.")
    restart_mode: Literal["InPlace", "Recreate"] | None = Field(
        default=None,
        description="InPlace: a gang restart keeps every worker pod whose node is healthy and starts the next "
                    "attempt's process inside it (the first container runs under reprieve-supervisor, the runtime's "
                    "supervisor; its command must be set); only pods on doomed or lost nodes are replaced. "
                    "Recreate: every pod is deleted and created again. Default: InPlace when the first container "
                    "sets its command, Recreate when it runs the image's entrypoint (which cannot be wrapped); "
                    "status.restartMode says which. Immutable.",
        json_schema_extra=_immutable("restartMode"))
    spares: int = Field(
        default=0, ge=0, le=MAX_REPLICAS,
        description="Warm spare pods (InPlace only): scheduled, image pulled and pre-warmed on other nodes; at a "
                    "restart a spare takes over the index of a worker whose node is doomed or lost, so the "
                    "restart never waits for scheduling or a pull. At most replicas. Spares never count as "
                    "workers.")
    elastic: ElasticSpec | None = Field(
        default=None,
        description="Elastic training (restartMode InPlace only): shrink to the survivors when a replacement "
                    "stays unschedulable, grow back when capacity returns. Unset: the job waits for its full size.")
    service_account: ServiceAccountSpec = Field(
        default_factory=ServiceAccountSpec, json_schema_extra={"default": {}},
        description="The worker ServiceAccount the operator creates when template.spec.serviceAccountName is "
                    "unset. Either way the workers' identity is bound to a Role that lets them watch and "
                    "annotate their own pods.")

    @field_validator("template")
    @classmethod
    def _template(cls, v: dict[str, Any]) -> dict[str, Any]:
        spec = v.get("spec")
        if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
            raise ValueError("template.spec.containers must be a non-empty list")
        if spec.get("restartPolicy", "Never") != "Never":
            raise ValueError(f"template.spec.restartPolicy must be Never, got {spec['restartPolicy']!r}")
        for owned in ("hostname", "subdomain"):
            if owned in spec:
                raise ValueError(f"template.spec.{owned} is set by the operator (worker index), got {spec[owned]!r}")
        names = [c.get("name") for c in spec["containers"] if isinstance(c, dict)]
        if len(names) != len(spec["containers"]) or len(set(names)) != len(names):
            raise ValueError(f"template.spec.containers must be objects with unique names, got {names!r}")
        return v

    @model_validator(mode="after")
    def _restart_mode(self) -> TrainingJobSpec:
        if self.spares > self.replicas:
            raise ValueError(f"spares must be at most replicas ({self.replicas}), got {self.spares}")
        if self.spares and self.mode != "InPlace":
            raise ValueError("spares need restartMode InPlace (the default only when the first container sets its "
                             "command)")
        if self.checkpoint.memory is not None and self.checkpoint.memory.enabled and self.mode != "InPlace":
            raise ValueError(MEMORY_NEEDS_INPLACE)
        if self.elastic is not None:
            if self.elastic.min_replicas > self.replicas:
                raise ValueError(f"spec.elastic.minReplicas must be at most spec.replicas ({self.replicas}), got "
                                 f"{self.elastic.min_replicas}")
            shards = self.elastic.virtual_shards
            if shards is not None and shards % self.replicas:
                raise ValueError(f"spec.elastic.virtualShards must be a multiple of spec.replicas ({self.replicas}), "
                                 f"got {shards}")
            if self.mode != "InPlace":
                raise ValueError(ELASTIC_NEEDS_INPLACE)
        if self.restart_mode == "InPlace" and not self.has_command:
            raise ValueError("template.spec.containers[0].command must be set for restartMode InPlace (the "
                             "operator runs it under reprieve-supervisor); set the command, or restartMode: Recreate")
        return self

    @property
    def has_command(self) -> bool:
        first = ((self.template.get("spec") or {}).get("containers") or [{}])[0]
        return bool(isinstance(first, dict) and first.get("command"))

    @property
    def mode(self) -> Literal["InPlace", "Recreate"]:
        """The restart mode in effect: ``restartMode``, else InPlace when the first container sets its command
        (the operator can run it under reprieve-supervisor), else Recreate (an image's entrypoint cannot be wrapped)."""
        if self.restart_mode is not None:
            return self.restart_mode
        return "InPlace" if self.has_command else "Recreate"

    @model_validator(mode="after")
    def _identity(self) -> TrainingJobSpec:
        named = (self.template.get("spec") or {}).get("serviceAccountName")
        if named and (self.service_account.annotations or self.service_account.labels):
            raise ValueError(f"serviceAccount.annotations/labels apply to the ServiceAccount the operator creates, "
                             f"but template.spec.serviceAccountName names your own ({named!r}): annotate that one")
        return self

    @model_validator(mode="after")
    def _notice_keys(self) -> TrainingJobSpec:
        known = set(BUILTIN_SIGNAL_NAMES) | {c.name for c in self.preemption.custom} | {KUEUE_NOTICE}
        unknown = sorted(set(self.preemption.notice_seconds) - known)
        if unknown:
            raise ValueError(f"preemption.noticeSeconds names unknown signal(s) {unknown}; "
                             f"expected built-in or custom signal names")
        return self


class Condition(_Model):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None


class RestartCounts(_Model):
    preemption: int = Field(default=0, description="Gang restarts after a noticed preemption or restart code.")
    failure: int = Field(default=0, description="Gang restarts (or the final failure) after a worker failed.")
    disruption: int = Field(default=0, description="Gang restarts after a worker was lost without notice.")


class NoticeStatus(_Model):
    id: str
    node: str
    reason: str
    deadline: str
    observed_at: str
    attempt: int = Field(description="Attempt the notice was delivered to (the earliest deadline of the attempt).")
    delivered_at: str | None = None


class BadputSeconds(_Model):
    """Where the seconds that were not productive went (``docs/goodput.md``)."""

    startup: float = Field(default=0.0, description="Pod creation to the first step: scheduling, image pull, "
                                                    "process start, jax.distributed, compilation.")
    restore: float = Field(default=0.0, description="Reading the checkpoint (reported by the runtime).")
    checkpoint: float = Field(default=0.0, description="The training loop blocked by saves.")
    lost: float = Field(default=0.0, description="Steps computed again by a later attempt (not checkpointed).")
    restart_gap: float = Field(default=0.0, description="Last step of an attempt to the next attempt's creation: "
                                                        "the agreed save, exit, teardown, the restart decision.")


class RestoreTally(_Model):
    count: int = Field(default=0, description="Restores that read from this tier.")
    seconds: float = Field(default=0.0, description="Their restore time in total (part of badput restore).")


class RestoresByTier(_Model):
    """Restores by where they read (``docs/goodput.md``): the memory tier (own or a peer's memory), mixed (some
    processes from storage), storage."""

    memory: RestoreTally | None = None
    mixed: RestoreTally | None = None
    storage: RestoreTally | None = None


class DegradedGoodput(_Model):
    """Elastic: the productive time of attempts that trained on fewer workers than desired (``docs/goodput.md``,
    "Degraded"); a part of productiveSeconds, at reduced throughput. Absent for a job that never trained shrunk."""

    seconds: float = Field(default=0.0, description="Productive seconds trained with fewer workers than desired "
                                                    "(part of productiveSeconds).")
    steps: int = Field(default=0, description="Kept steps trained with fewer workers than desired.")
    steps_per_second: float | None = Field(default=None, description="steps / seconds: the throughput while "
                                                                     "degraded.")
    full_size_steps_per_second: float | None = Field(
        default=None, description="Kept steps / productive seconds of the attempts at full size.")
    throughput_ratio: float | None = Field(
        default=None, description="stepsPerSecond / fullSizeStepsPerSecond (the same global batch: 0.75 on 3 of 4 "
                                  "workers scales perfectly).")
    workers_ratio: float | None = Field(
        default=None, description="Workers trained on / desired workers, averaged over the degraded seconds.")
    attempts: int = Field(default=0, description="Attempts that trained degraded.")


class GoodputStatus(_Model):
    """Per-job goodput accounting (``policy.goodput``), from progress reports, attempts and the job's end.
    Provisional while the job runs (the current attempt's steps count as kept until the next attempt reports
    where it resumed)."""

    goodput: float | None = Field(default=None, description="Productive seconds / wall seconds (0..1).")
    wall_seconds: float = Field(default=0.0, description="From attempt 1's creation to the last update.")
    productive_seconds: float = 0.0
    badput_seconds: BadputSeconds = Field(default_factory=BadputSeconds)
    lost_steps: int = Field(default=0, description="Steps computed again after interruptions.")
    restores: RestoresByTier = Field(default_factory=RestoresByTier,
                                     description="Restores by the tier they read from, with their seconds.")
    degraded: DegradedGoodput | None = Field(
        default=None, description="Elastic: productive time trained with fewer workers than desired, and its "
                                  "throughput against full size.")
    updated_at: str | None = Field(default=None, description="When these figures were computed.")
    accounting: dict[str, Any] = Field(
        default_factory=dict, description="The operator's bookkeeping (closed buckets, open attempts); internal.",
        json_schema_extra={"crd": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}})


class Replaced(_Model):
    index: int
    old: str | None = None
    new: str | None = None
    reason: str = ""


class LastRestart(_Model):
    attempt: int
    in_place: int = Field(default=0, description="Workers whose pods were kept (a new process in the same pod).")
    replaced: list[Replaced] = Field(default_factory=list)


class LastRestore(_Model):
    attempt: int
    step: int
    tier: str = Field(description="memory, mixed or storage.")
    sources: list[str] = Field(default_factory=list, description="Per process index: memory, peer or storage.")


class TrainingJobStatus(_Model):
    """Observed state; also what a goodput figure needs (times, attempts, committed step)."""

    phase: Literal["Pending", "Running", "Preempting", "Restarting", "Succeeded", "Failed", "Suspended"] | None = None
    conditions: list[Condition] = Field(default_factory=list)
    attempt: int = Field(default=0, description="Current gang attempt (1, 2, ...); 0 before the first.")
    restarting_from: int | None = Field(
        default=None, description="Attempt being torn down for a gang restart (set until attempt+1 starts).")
    restarts: RestartCounts = Field(default_factory=RestartCounts)
    restart_count: int = Field(default=0, description="Total gang restarts (all causes).")
    rapid_restarts: int = Field(
        default=0, description="Consecutive rapid restarts (restart code within 60 s, no notice); 0 once an "
                               "attempt ends otherwise.")
    next_attempt_time: str | None = Field(
        default=None, description="While backing off after a rapid restart: when the next attempt starts.")
    replicas: int | None = Field(default=None, description="Worker pods of the current attempt that exist "
                                                           "(the scale subresource's status replicas).")
    selector: str | None = Field(default=None, description="Label selector of the job's worker pods.")
    desired_workers: int | None = Field(
        default=None, description="The workers the job asks for (spec.replicas).")
    current_workers: int | None = Field(
        default=None, description="The workers the current attempt trains on: fewer than desiredWorkers while an "
                                  "elastic job runs shrunk (condition Degraded).")
    last_resize_time: str | None = Field(
        default=None, description="Elastic: when the job last changed its size (spec.elastic."
                                  "minResizeIntervalSeconds counts from it).")
    spares: str | None = Field(default=None, description="Ready spares / spec.spares (in-place mode).")
    restart_mode: str | None = Field(default=None, description="The restart mode in effect (spec.restartMode, or "
                                                               "its default for this template).")
    last_restart: LastRestart | None = Field(
        default=None, description="The last in-place restart: how many workers restarted in place, which were "
                                  "replaced, by which pod, and why.")
    ready: str | None = Field(default=None, description="Running workers / replicas, e.g. '3/4'.")
    last_notice: NoticeStatus | None = None
    step: int | None = Field(default=None, description="Latest step reported by process 0 (live, every few "
                                                       "seconds; docs/contract.md, \"Progress\").")
    last_checkpoint_step: int | None = Field(default=None, description="Latest committed checkpoint step.")
    last_checkpoint_time: str | None = None
    memory_step: int | None = Field(
        default=None, description="The memory tier: the newest step every process of the current attempt holds in "
                                  "memory (beside lastCheckpointStep, the newest in storage).")
    last_restore: LastRestore | None = Field(
        default=None, description="Where the current attempt's restore read: its step, tier and each process's "
                                  "source (memory: own pod, peer: another pod's memory, storage).")
    last_checkpoint_uri: str | None = Field(default=None, description="Where the last committed checkpoint is: "
                                            "the checkpoint root (spec.checkpoint.uri) it was committed under.")
    start_time: str | None = Field(default=None, description="When attempt 1 was created.")
    attempt_start_time: str | None = Field(default=None, description="When the current attempt was created.")
    completion_time: str | None = None
    observed_generation: int | None = None
    goodput: GoodputStatus | None = None


class TrainingJob(_Model):
    """A TrainingJob as read from the API: identity plus validated spec and status."""

    name: str
    namespace: str
    uid: str
    spec: TrainingJobSpec
    status: TrainingJobStatus = Field(default_factory=TrainingJobStatus)
    generation: int | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> TrainingJob:
        meta = body.get("metadata") or {}
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            uid=meta.get("uid", ""),
            generation=meta.get("generation"),
            spec=TrainingJobSpec.model_validate(body.get("spec") or {}),
            status=TrainingJobStatus.model_validate(_known_status(body.get("status") or {})),
        )


def _known_status(status: dict[str, Any]) -> dict[str, Any]:
    # Status may carry fields written by other tools (or an older operator); keep what we understand.
    fields = {f.alias or n for n, f in TrainingJobStatus.model_fields.items()}
    return {k: v for k, v in status.items() if k in fields}


def spec_error(name: str, namespace: str, err: Exception) -> str:
    """A one-line, user-actionable message for an invalid spec (names object, field, expected, found)."""
    from pydantic import ValidationError

    if isinstance(err, ValidationError):
        parts = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"])
            found = e.get("input")
            # Name the field; show the value only when it is a scalar (never dump a whole pod template).
            shown = f" (found {found!r})"[:120] if not isinstance(found, (dict, list)) else ""
            parts.append(f"spec.{loc}: {e['msg']}{shown}"[:400])
        return f"TrainingJob {namespace}/{name}: " + "; ".join(parts)
    return f"TrainingJob {namespace}/{name}: {err}"
