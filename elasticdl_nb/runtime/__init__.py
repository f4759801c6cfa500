"""The runtime: the processes of a job and what they say to each other.

- `master/`: the brain: tasks, elastic policy over instances, the event journal,
  evaluation and checkpoint coordination (one per job);
- `worker/`: pulls tasks, trains on its slices, pushes to the PS or allreduces;
- `ps/`: parameter servers: shards of the model, the optimizer, checkpoints;
- `collective/`: the allreduce ring and its group membership;
- `protocol/`: gRPC messages, channels with per-job tokens, the bulk and ring framing;
- `job_dir`, `process_env`, `exit_codes`: the job directory's layout, what a process
  learns from its environment, and the exit codes that tell the master why one ended.

It imports no backend, SDK or front end (`make lint` checks): where a backend is
needed, the runtime defines the plug (`master/site.py`) and the backend fills it.
"""
