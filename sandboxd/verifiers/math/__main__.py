"""Manual check: ``python -m sandboxd.verifiers.math COMPLETION GROUND_TRUTH`` prints the verdict."""

import json
import sys

from sandboxd.verifiers.math import verify

print(json.dumps(verify(sys.argv[1], sys.argv[2]), indent=2))  # pragma: no cover - manual check
