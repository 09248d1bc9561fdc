import sys

from tokenflip.cli import main

sys.exit(main())
