"""Reprieve operator (kopf): TrainingJob reconciler and node-signal watcher."""
