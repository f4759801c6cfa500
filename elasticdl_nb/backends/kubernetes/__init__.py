"""The Kubernetes backend (`backend.KubernetesBackend`): a job's processes as pods.

From the notebook, `submit` creates the master's Job (whose one pod is the master; the
kubelet restarts a master that fails in place, the Job makes a new pod for one that is
deleted) with its Service, ConfigMap (the job directory's files) and Secret (the token),
all owned by the Job; `master_link` reaches the master (Service IP, DNS, or a
port-forward to whichever pod is the master) and `find` finds jobs by label. In the
master pod, `master_site` learns its owner and addresses, makes a Service per PS and
decides whether it may take the job over; `master_signals` tells a pod going from a job
being stopped; `launcher` creates worker and PS pods from `manifests` (with
`pod_template` overrides), adopts those of a master before it, and turns what
`pod_watch` sees into instance events (`pod_events`)."""
