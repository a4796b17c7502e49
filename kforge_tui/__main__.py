"""`python -m kforge_tui` is the same as the `kforge-tui` command."""

import sys

from kforge_tui.cli import main

sys.exit(main())
