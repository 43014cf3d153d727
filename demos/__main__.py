import sys

from demos.app import main

sys.exit(main())
