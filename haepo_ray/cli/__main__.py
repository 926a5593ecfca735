"""``python -m haepo_ray.cli``: the ``haepo`` command (how Ray Jobs run it without an install)."""

import sys

from haepo_ray.cli import main

sys.exit(main())
