"""The notice source that watches the job's notice object, the ConfigMap ``<job>-notice`` (docs/notices.md, "One
write per job"): the operator writes a notice there once per job, and the API server's watch cache carries it to
every pod of the job. The pod says on itself that it watches it (``reprieve.dev/notice-watch: <job>-notice``, written
once its list answered), so the operator annotates only pods that do not; a watch the API server refuses (401,
403: RBAC; 429: shedding load) is said too (``refused: HTTP 403``): the operator annotates that pod again, and the
pod's own watch (``kube.PodWatchSource``) hears it there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .kube import KubeClient, KubeError, NoticeValues, ObjectWatch, PodAnnotator
from .notice import (
    NOTICE_ANNOTATION,
    NOTICE_OBJECT_KEY,
    NOTICE_OBJECT_SUFFIX,
    NOTICE_WATCH_ANNOTATION,
    Notice,
)

log = logging.getLogger(__name__)

REFUSALS = (401, 403, 429)  # the API server will not serve this pod the object: the operator must annotate it


def notice_object_name(job: str) -> str:
    return f"{job}{NOTICE_OBJECT_SUFFIX}"


def declaration(object_name: str, refused: int | None) -> str:
    """The value of this pod's ``reprieve.dev/notice-watch``: the object it watches, or why it cannot."""
    return object_name if refused is None else f"refused: HTTP {refused}"


class JobNoticeWatch(ObjectWatch):
    """Lists, then watches, ``<job>-notice`` and hands its notice to ``put``; says on the pod whether it watches."""

    def __init__(self, client: KubeClient, namespace: str, job: str, pod: str, put: Callable[[Notice], None], *,
                 clock: Callable[[], float] = time.time, attempt: int | None = None,
                 started_at: float | None = None, annotator: PodAnnotator | None = None) -> None:
        self.object_name = notice_object_name(job)
        super().__init__(client, namespace, "configmaps", self.object_name, self._changed)
        self._values = NoticeValues(put, "job-notice", clock=clock, attempt=attempt, started_at=started_at)
        self._annotator = annotator if annotator is not None else PodAnnotator(client, namespace, pod)
        self._declared: str | None = None

    def _session(self, connected: Callable[[], None]) -> None:
        def listed() -> None:
            connected()
            self._declare(declaration(self.object_name, None))

        try:
            super()._session(listed)
        except KubeError as err:
            if err.status in REFUSALS:
                self._declare(declaration(self.object_name, err.status))
            raise

    def _changed(self, obj: dict[str, Any] | None) -> None:
        value = ((obj or {}).get("data") or {}).get(NOTICE_OBJECT_KEY)
        if value is not None:
            self._values.offer({NOTICE_ANNOTATION: value})

    def _declare(self, value: str) -> None:
        """Say it on the pod, once per change (a pod that said the same before this process started is written
        once more: one write per pod and attempt, never per notice)."""
        if value != self._declared:
            self._declared = value
            self._annotator.put({NOTICE_WATCH_ANNOTATION: value})
            log.debug("%s: %s", self.what, value)

    def close(self) -> None:
        super().close()
        self._annotator.close()
