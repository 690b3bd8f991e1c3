"""``python -m tools.gen_sync``: see :mod:`tools.gen_sync`."""

import sys

from tools.gen_sync import main

sys.exit(main())
