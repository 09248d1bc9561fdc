import sys

from tokenflip.cli.main import main

sys.exit(main())
