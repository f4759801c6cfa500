"""The local backend: job processes on this machine, detached from the caller."""
