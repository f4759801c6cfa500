"""The master process: `python -m elasticdl_nb.backends.master_process --job-dir DIR`.

Started detached by the local backend (a kernel restart does not end the job), or as a
job's master pod. It picks the site of the job's backend and hands it to the runtime
(`runtime.master.serve`), which runs the job to its end. It sits here, above both, so the
runtime never imports a backend.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from elasticdl_nb.backends import get_backend
from elasticdl_nb.runtime.logs import setup_logging
from elasticdl_nb.runtime.master.serve import serve


def _copy_job_files(source: Path, job_dir: Path) -> None:
    """The job's files from a mounted ConfigMap into the job directory. A ConfigMap volume
    holds its files behind `..data` symlinks; those hidden entries are not copied."""
    job_dir.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.name.startswith(".."):
            continue
        if entry.is_dir():
            shutil.copytree(entry, job_dir / entry.name, dirs_exist_ok=True)
        else:
            shutil.copyfile(entry, job_dir / entry.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument(
        "--copy-from", type=Path, help="copy the job's files from here first (a ConfigMap)"
    )
    args = parser.parse_args()
    setup_logging("master")
    if args.copy_from:
        _copy_job_files(args.copy_from, args.job_dir)
    serve(args.job_dir, lambda spec, job_dir: get_backend(spec.backend).master_site(spec, job_dir))


if __name__ == "__main__":
    main()
