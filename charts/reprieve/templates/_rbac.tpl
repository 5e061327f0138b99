{{/* Rules the operator needs in every namespace it watches (a ClusterRole, or a Role per namespace). */}}
{{- define "reprieve.namespacedRules" -}}
# Watch TrainingJobs; patch them because kopf keeps its handler progress and last-handled spec in
# reprieve.dev/* annotations on the object.
- apiGroups: ["reprieve.dev"]
  resources: ["trainingjobs"]
  verbs: ["get", "list", "watch", "patch"]
# Kopf and the operator post Kubernetes Events on the objects they handle.
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# Write status: phase, conditions, attempt, restarts by cause, last notice, committed step.
- apiGroups: ["reprieve.dev"]
  resources: ["trainingjobs/status"]
  verbs: ["get", "patch", "update"]
# Owned objects carry blockOwnerDeletion, which needs update on the owner's finalizers.
- apiGroups: ["reprieve.dev"]
  resources: ["trainingjobs/finalizers"]
  verbs: ["update"]
# Create and delete worker pods (gang restarts), annotate them with notices, read exit codes and the
# runtime's progress annotation. get/list/watch/patch are also what the per-job worker Role grants, and
# RBAC only lets the operator grant what it holds.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# The headless Service that gives each worker its DNS name (J-<i>.J.NS.svc). delete: a job whose pods
# the API server refuses for good is left with nothing (these objects are otherwise garbage-collected
# with their job).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "delete"]
# The per-job worker identity: ServiceAccount J-worker (patch: spec.serviceAccount annotations, e.g. for
# workload identity, are applied again at each attempt) ...
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create", "delete", "patch"]
# ... with a Role + RoleBinding limited to the job's own pods (docs/contract.md). patch: with in-place restarts the
# Role's pod names follow the replacements and spares.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles"]
  verbs: ["get", "create", "delete", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["rolebindings"]
  verbs: ["get", "create", "delete"]
# The memory tier: the job's token Secret J-memory (a random token its pods' replica servers ask for). Created
# with the job's first pods, deleted with a job that cannot start; never read back (no get/list/watch).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "delete"]
# In-place restarts: the assignment of each attempt (ConfigMap J-assignment, read by the workers' supervisors;
# list/watch only because RBAC lets the operator grant the workers no more than it holds).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
{{- if .Values.kueue.enabled }}
# Kueue (kueue.enabled): the Workload of each queued job (create; delete: replaced while queued when the job no
# longer matches it; patch: its queue name and the last-checkpoint annotation), watched to see admissions and
# evictions ...
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# ... and its status: after an eviction, the operator gives the quota back once the gang saved and is gone.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["get", "patch"]
{{- end }}
{{- end }}
