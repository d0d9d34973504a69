"""python -m zoo_models [NAME ...] (run from bench/): materialize every zoo entry, or the named ones."""

import sys
import traceback

from zoo_models import entries, materialize

wanted = set(sys.argv[1:])
failed = []
for entry in entries():
    if wanted and entry.name not in wanted:
        continue
    try:
        print(f"{entry.name}: {materialize(entry)}", flush=True)
    except (Exception, SystemExit) as exc:  # one entry's failure does not stop the others
        traceback.print_exc()
        failed.append(f"{entry.name}: {exc}")
print("\n".join(failed) or "all materialized")
sys.exit(1 if failed else 0)
