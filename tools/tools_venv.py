"""Re-runs a tool under .venv-tools (made by tools/tools_venv.sh with the
PyPI packages it names) when the modules the tool needs are missing here.

    sys.path.insert(0, <the tools folder>); import tools_venv
    tools_venv.ensure(["llama_cpp", "numpy"], ["llama-cpp-python", "numpy"])
"""
import importlib
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv-tools", "bin", "python")


def ensure(modules, packages):
    """Returns when every module imports; otherwise installs `packages` into
    .venv-tools and re-executes the running script there (once)."""
    try:
        for m in modules:
            importlib.import_module(m)
        return
    except ImportError:
        pass
    if os.environ.get("RILL_TOOLS_REEXEC"):
        sys.exit("/".join(modules) + " still not importable under " + sys.executable)
    subprocess.check_call([os.path.join(ROOT, "tools", "tools_venv.sh"), *packages])
    os.environ["RILL_TOOLS_REEXEC"] = "1"
    os.execv(VENV_PY, [VENV_PY] + sys.argv)
