"""The simulator is an extra: `import sim` without it says which package to install, rather than
which of its modules failed to import. torch is only looked for, not imported: it takes seconds to
import, so only what runs or trains a policy imports it."""

import importlib.util


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):  # an import hook may say so by raising
        return True


for _name in ("orjson", "torch"):
    if _missing(_name):
        raise ModuleNotFoundError(
            f"sim needs the sim extra ({_name} is not installed): pip install 'simnet-fleet[sim]'",
            name=_name,
        )
