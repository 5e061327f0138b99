"""Reprieve operator (kopf): TrainingJob reconciler and node-signal watcher."""

LABEL_JOB = "reprieve.dev/job-name"
LABEL_INDEX = "reprieve.dev/replica-index"
LABEL_ATTEMPT = "reprieve.dev/attempt"
ANNOTATION_NOTICE = "reprieve.dev/notice"
ANNOTATION_PROGRESS = "reprieve.dev/progress"
