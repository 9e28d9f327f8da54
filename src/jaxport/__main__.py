"""`python -m jaxport`: the `jaxport` command."""
import sys

from jaxport.cli import main

sys.exit(main())
