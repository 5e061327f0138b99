"""Reprieve operator (kopf): TrainingJob reconciler and node-signal watcher."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("reprieve-operator")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

LABEL_JOB = "reprieve.dev/job-name"
LABEL_INDEX = "reprieve.dev/replica-index"
LABEL_ATTEMPT = "reprieve.dev/attempt"
ANNOTATION_NOTICE = "reprieve.dev/notice"
ANNOTATION_PROGRESS = "reprieve.dev/progress"
# The runtime -> the operator: this pod watches the job's notice object (its value names it; docs/notices.md)
ANNOTATION_NOTICE_WATCH = "reprieve.dev/notice-watch"
NOTICE_OBJECT_SUFFIX = "-notice"  # the ConfigMap <job>-notice: one write per job per notice
NOTICE_OBJECT_KEY = "notice"  # its data key: the value the pod annotation would carry
LABEL_ROLE = "reprieve.dev/role"  # worker | spare (in-place mode)
ANNOTATION_EXIT = "reprieve.dev/exit"  # the supervisor's exit report
ANNOTATION_SUPERVISOR = "reprieve.dev/supervisor"
CONTRACT_VERSION = 1  # docs/contract.md, "In-place restarts and the supervisor"
# A grow's assignment says so (docs/contract.md, "Elastic jobs"): each supervisor stops its running trainer with the
# resize signal, and the gang saves the agreed step to the memory tier alone.
ASSIGNMENT_RESIZE_KEY = "resize"
# The memory tier's copies are spaced for the job's loss rate so far (docs/contract.md, "In-place restarts")
ASSIGNMENT_LOSS_EVERY_KEY = "lossEverySeconds"
RESIZE_GROW = "grow"
SUPERVISOR = "reprieve-supervisor"
