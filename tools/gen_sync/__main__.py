"""``python -m tools.gen_sync``: see :mod:`tools.gen_sync`."""

from tools.gen_sync import main

raise SystemExit(main())
