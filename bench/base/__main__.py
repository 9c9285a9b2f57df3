"""``python -m bench.base``: see :mod:`bench.base.run`."""

from bench.base.run import main

raise SystemExit(main())
