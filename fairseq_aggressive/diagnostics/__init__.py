"""Code the diagnostic scripts (scripts/diagnostics/) share: they import it
from the package, as every script does (no script puts a folder on sys.path)."""
