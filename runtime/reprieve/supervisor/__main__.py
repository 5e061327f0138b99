"""``python -m reprieve.supervisor``: the same as ``reprieve-run``."""

from .process import main

raise SystemExit(main())
