"""Builders for TrainingJob bodies in tests (``make_job(replicas=4).with_checkpoint(uri)``)."""

from __future__ import annotations

import copy
from typing import Any

from reprieve_operator.models import TrainingJob


class JobBody(dict):  # type: ignore[type-arg]
    """A TrainingJob manifest with chainable tweaks; ``.model()`` gives the validated TrainingJob."""

    def with_checkpoint(self, uri: str, interval: int = 0, keep: int = 2) -> JobBody:
        self["spec"]["checkpoint"] = {"uri": uri, "intervalSteps": interval, "keep": keep}
        return self

    def with_spec(self, **fields: Any) -> JobBody:
        self["spec"].update(fields)
        return self

    def with_status(self, **fields: Any) -> JobBody:
        self.setdefault("status", {}).update(fields)
        return self

    def with_command(self, *command: str) -> JobBody:
        self["spec"]["template"]["spec"]["containers"][0]["command"] = list(command)
        return self

    def model(self) -> TrainingJob:
        return TrainingJob.from_body(copy.deepcopy(dict(self)))


def make_job(name: str = "llama", namespace: str = "default", replicas: int = 2, **spec: Any) -> JobBody:
    body = JobBody(
        apiVersion="reprieve.dev/v1alpha1",
        kind="TrainingJob",
        metadata={"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        spec={
            "replicas": replicas,
            "template": {"spec": {"containers": [{"name": "trainer", "image": "python:3.11"}]}},
            "checkpoint": {"uri": "/ckpt"},
            **spec,
        },
    )
    return body
