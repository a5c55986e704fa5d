"""`python -m llamatui.app.cli ARGS`: the `llamatui` command."""
import sys

from . import main

sys.exit(main())
