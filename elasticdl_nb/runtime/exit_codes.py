"""Exit codes by which a worker or PS tells its master why it ended, where the reason
changes what the master does (see master/instances.py). Any other non-zero code is a crash,
relaunched within the job's budget."""

USER_CODE_EXIT = 3  # failed in the user's code (and reported the error itself): no relaunch
WRONG_PEER_EXIT = 4  # a peer's address is served by something else: the job fails with why
