"""The master: one per job, the only process that decides.

It cuts the data into tasks and hands them to workers, re-queues what a lost worker did
not finish, starts and relaunches instances through its site's launcher (the elastic
policy is `instances.InstanceManager`), coordinates evaluation, export and checkpoints,
and appends every fact to the job's journal (`journal.Journal`), which every view of the
job reads. `serve.serve` is the life of the master process.
"""
