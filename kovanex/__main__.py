import sys

from kovanex.cli.main import main

sys.exit(main())
