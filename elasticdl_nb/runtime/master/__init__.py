"""The master: one per job, the only process that decides.

It cuts the data into tasks and hands them to workers, re-queues what a lost worker did
not finish, starts and relaunches instances through its site's launcher, coordinates
evaluation, export and checkpoints, and appends every fact to the job's journal, which
every view of the job reads.

- `serve.py`: the life of the master process; `assembly.py`: `build_master`, the one way
  to put a master together;
- `job_master.py`: `JobMaster`, the job whatever the strategy (its state, and the façade
  the rest calls); its parts: `task_desk.py` (GetTask and ReportProgress, retried calls
  counted once), `coordinator.py` (the thread that moves the job on),
  `callback_decisions.py` (what the model's callbacks decided); `phases.py`: its phases
  and their allowed moves; `progress.py`, `evaluation.py`, `tasks.py`: progress,
  evaluation rounds, the task queue;
- `strategy.py`: `TrainingStrategy`, the seam to how the job trains, filled by
  `ps_strategy.PsStrategy` and `allreduce_group.AllreduceGroup`;
- `instances.py`: `InstanceManager`, the elastic policy over the site's launcher;
- `site.py`: the plugs a backend fills (`MasterSite`, `InstanceLauncher`, `InstanceEvent`);
- `journal.py`: the event journal; `service.py`: the Master gRPC service;
- `tensorboard_log.py`: the job's TensorBoard event file, written from the journal
  (`summaries.py`: which scalars each event gives).
"""
