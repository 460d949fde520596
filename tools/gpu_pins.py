"""Print the `# gpu:` lines of requirements.lock: exact pins of TensorFlow's CUDA wheels.

    python tools/gpu_pins.py requirements.lock >> requirements.lock   (what `make lock` does)

TensorFlow's `and-cuda` extra gives version ranges; pip resolves them here, constrained by the
lock, and the Dockerfile installs exactly these. They are comments so that `make install` on a
machine without a GPU does not download them.
"""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

lock = Path(sys.argv[1] if len(sys.argv) > 1 else "requirements.lock")
base = "\n".join(line for line in lock.read_text().splitlines() if not line.startswith("# gpu:"))
tf = re.search(r"^tensorflow==(\S+)$", base, re.M).group(1)
with tempfile.TemporaryDirectory() as tmp:
    constraints, report = Path(tmp) / "c.txt", Path(tmp) / "report.json"
    constraints.write_text(base)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run",
                    "--ignore-installed", "--report", str(report), "-c", str(constraints),
                    f"tensorflow[and-cuda]=={tf}"], check=True)
    installs = json.loads(report.read_text())["install"]
for item in sorted(installs, key=lambda i: i["metadata"]["name"].lower()):
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if name.lower().startswith("nvidia-"):
        print(f"# gpu: {name}=={version}")
