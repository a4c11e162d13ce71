"""python -m measure.llamacpp run|check (measure/llamacpp/run.py)."""

import sys

from .run import main

sys.exit(main())
