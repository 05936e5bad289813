"""Installing Hone Studio: read the machine, plan the PyTorch build, fill the venv, check PyTorch works.

The Windows installer and install.sh run `python -m hone.core.install plan|apply|check`; the app runs
`check_runtime` on start. Stdlib only (torch is imported by the check, when it runs).
"""

from hone.core.install.machine import Gpu, Machine, probe_machine
from hone.core.install.plan import InstallPlan, plan_install
from hone.core.install.runtime import Finding, check_runtime

__all__ = ["Finding", "Gpu", "InstallPlan", "Machine", "check_runtime", "plan_install", "probe_machine"]
