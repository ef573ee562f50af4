"""Fetch the released test harness of the INSTALLED transformers from the package registry (pip), for
``make peers-hf``: ``pip download --no-binary :all: --no-deps transformers==<installed>`` and extract its tests.

What the registry offers (checked for transformers 5.23.0): the sdist holds only the 22 top-level mixin files of
``tests/`` (``test_modeling_common.py`` with ``ModelTesterMixin``, ``test_pipeline_mixin.py``, ...), not
``tests/models/*`` (so not ``tests/models/vit/test_modeling_vit.py``) and not ``tests/exporters`` /
``tests/generation`` / ``tests/utils``, which ``test_modeling_common.py`` and ``test_configuration_common.py``
import. So this writes empty stand-ins for those two mixins (``ExportTesterMixin``: transformers' torch.export
tests do not run here; ``GenerationTesterMixin``: unused by vision models) and copies in vit-fast's own model
testers (tools/peers/test_vision_peers.py), the patching plugin (tools/peers/conftest.py) and the launch counter
(tools/peers/launches.py).

    python tools/peers/fetch_transformers_tests.py .peers      # prints the harness folder
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the module name launches.py (the launch counter, a pytest plugin) has in the harness
LAUNCH_PLUGIN = "vit_fast_peer_launches"
STUBS = {
    "__init__.py": "",
    "models/__init__.py": "",
    "exporters/__init__.py": "",
    "exporters/test_export.py": (
        '"""Stand-in (not in the sdist): transformers\' torch.export tests are not run by make peers-hf."""\n\n\n'
        "class ExportTesterMixin:\n    pass\n"
    ),
    "generation/__init__.py": "",
    "generation/test_utils.py": (
        '"""Stand-in (not in the sdist): generation tests do not apply to vision encoders."""\n\n\n'
        "class GenerationTesterMixin:\n    pass\n"
    ),
}


def main(dest: str) -> Path:
    import transformers

    version = transformers.__version__
    root = Path(dest).resolve() / f"transformers-{version}"
    tests = root / "tests"
    if not (tests / "test_modeling_common.py").exists():
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps"]
            subprocess.run([*cmd, "--no-build-isolation", f"transformers=={version}", "-d", tmp], check=True)
            (sdist,) = Path(tmp).glob("transformers-*.tar.gz")
            prefix = f"transformers-{version}/tests/"
            with tarfile.open(sdist) as tar:
                members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
                if not any(m.name.endswith("test_modeling_common.py") for m in members):
                    raise SystemExit(f"the transformers {version} sdist has no tests/test_modeling_common.py")
                tests.mkdir(parents=True, exist_ok=True)
                for m in members:
                    m.name = m.name[len(prefix) :]
                    tar.extract(m, tests, filter="data")
    for rel, text in STUBS.items():
        path = tests / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_text(text)
    (tests / "models" / "vit_fast_peers").mkdir(exist_ok=True)
    (tests / "models" / "vit_fast_peers" / "__init__.py").write_text("")
    shutil.copy(HERE / "test_vision_peers.py", tests / "models" / "vit_fast_peers" / "test_vision_peers.py")
    shutil.copy(HERE / "conftest.py", root / "conftest.py")
    shutil.copy(HERE / "launches.py", root / f"{LAUNCH_PLUGIN}.py")  # the launch counter, loaded with -p
    # the harness's own pytest root: vit-fast's pyproject settings (strict markers) are not transformers'
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    return root


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else ".peers"))
