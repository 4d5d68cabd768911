"""`python -m kit.bench NAME`: see kit.bench."""
import sys

from kit.bench import main

sys.exit(main())
