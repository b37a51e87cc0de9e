"""`python -m zoo.export STAGE JOB_JSON`: a fresh process of a weight-only int8 conversion
(zoo.export.convert.write_flatbuffer starts them; not a user command)."""

import json
import sys

from zoo.export.convert import run_stage

run_stage(sys.argv[1], json.loads(sys.argv[2]))
