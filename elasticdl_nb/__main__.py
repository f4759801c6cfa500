"""`python -m elasticdl_nb ...`: see elasticdl_nb/cli.py."""

import sys

from elasticdl_nb.cli import main

sys.exit(main())
