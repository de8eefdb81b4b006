import sys

from gpuwatchd.cli.main import main

sys.exit(main())
