"""``python -m bench.glue``: see :mod:`bench.glue.run`."""

from bench.glue.run import main

raise SystemExit(main())
