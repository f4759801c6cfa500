"""The Kubernetes backend (`backend.KubernetesBackend`): a job's processes as pods.

From the notebook, `submit` creates the master pod with its Service, ConfigMap (the job
directory's files) and Secret (the token), all owned by the master pod; `master_link`
reaches the master (Service IP, DNS, or a port-forward) and `find` finds jobs by label.
In the master pod, `master_site` learns its addresses and makes a Service per PS;
`launcher` creates worker and PS pods from `manifests` (with `pod_template` overrides)
and turns what `pod_watch` sees into instance events (`pod_events`)."""
