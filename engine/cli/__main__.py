"""`python -m engine.cli`: the variant-studio command."""

import sys

from engine.cli import main

sys.exit(main())
