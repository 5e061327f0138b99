"""``python -m reprieve.supervisor``: the same as ``reprieve-supervisor``."""

from .process import main

raise SystemExit(main())
