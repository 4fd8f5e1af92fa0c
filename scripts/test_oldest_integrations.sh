#!/usr/bin/env bash
# Runs the trainer tests against the oldest transformers, accelerate and Lightning that
# torch_rsdp's integrations claim: the low end of each tested range in
# torch_rsdp/integrations/_patch_table.py (the newest patch release of that minor version).
# It uses a virtual environment of its own (build/oldest-integrations) over this machine's
# packages, so torch and the built extension are the ones scripts/setup.sh installed; nothing
# outside that folder changes. Run it before widening a range; CI tests the pinned versions.
#
#   bash scripts/test_oldest_integrations.sh              # the trainer and integration tests
#   bash scripts/test_oldest_integrations.sh -k lightning # pytest arguments narrow them
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${RSDP_OLDEST_VENV:-build/oldest-integrations}

oldest=$($PY - <<'PY'
import pathlib, re
# read, not imported: importing torch_rsdp would load the extension before pip runs
text = pathlib.Path("torch_rsdp/integrations/_patch_table.py").read_text()
rows = re.findall(r'Library\("([\w]+)", "[\w.]+", "([\w-]+)", \("([\d.]+)", "[\d.]+"\)\)', text)
print(" ".join(f"{dist}=={lo}.*" for name, dist, lo in rows if name != "pytorch_lightning"))
PY
)
[ -n "$oldest" ] || { echo "[oldest] could not read the tested ranges" >&2; exit 2; }

if [ ! -x "$VENV/bin/python" ]; then
  echo "[oldest] creating $VENV (over this machine's packages)"
  $PY -m venv --system-site-packages "$VENV"
fi
echo "[oldest] pip install $oldest"
"$VENV/bin/python" -m pip install -q $oldest
"$VENV/bin/python" - <<'PY'
import accelerate, lightning, transformers
print(f"[oldest] transformers {transformers.__version__}, accelerate {accelerate.__version__}, "
      f"lightning {lightning.__version__}")
PY
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/integrations/test_trainers.py tests/integrations/test_integration_patches.py "$@"
