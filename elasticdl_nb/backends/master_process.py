"""The master process: `python -m elasticdl_nb.backends.master_process --job-dir DIR`.

Started by a local job's supervisor (`backends/local/supervisor.py`), or as a job's master
pod. It picks the site of the job's backend and hands it to the runtime
(`runtime.master.serve`), which runs the job to its end. It sits here, above both, so the
runtime never imports a backend.

Under a supervisor, its lifeline is set first, before the slow imports: a supervisor that
dies meanwhile takes this process with it (a pod's master has none to set).
"""

from elasticdl_nb.runtime.lifeline import die_with_parent

die_with_parent()

import argparse  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

from elasticdl_nb.backends import get_backend  # noqa: E402
from elasticdl_nb.runtime.job_dir import JobDir  # noqa: E402
from elasticdl_nb.runtime.logs import setup_logging  # noqa: E402
from elasticdl_nb.runtime.master.serve import serve  # noqa: E402


def _copy_job_files(source: Path, job_dir: Path) -> None:
    """The job's files from a mounted ConfigMap into the job directory (on the shared
    volume). A ConfigMap volume holds its files behind `..data` symlinks; those hidden
    entries are not copied. A job whose pods run as its user's own uid (`run_as`: a
    notebook in the cluster) keeps its directory to that user, as a local job's is: on
    a volume shared between users, no one else reads its checkpoints, journal or model."""
    job_dir.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.name.startswith(".."):
            continue
        if entry.is_dir():
            shutil.copytree(entry, job_dir / entry.name, dirs_exist_ok=True)
        else:
            shutil.copyfile(entry, job_dir / entry.name)
    if JobDir(job_dir).read_spec().run_as:
        job_dir.chmod(0o700)


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
