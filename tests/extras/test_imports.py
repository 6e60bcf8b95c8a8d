"""``import ciclo`` imports no optional package, even where they are installed."""

from __future__ import annotations

import subprocess
import sys

OPTIONAL = ("wandb", "mlflow", "grain", "tensorboardX", "matplotlib", "clu", "sklearn")


def test_import_ciclo_imports_no_optional_package():
    code = (
        "import sys, ciclo, ciclo.callbacks\n"
        f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
