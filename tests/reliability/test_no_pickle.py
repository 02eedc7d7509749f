"""No pickle anywhere on baton's load path: a scan of the package's syntax trees.

Fails on an import of a pickle-family module, on ``torch.load`` without ``weights_only=True``, on
``numpy.load`` with ``allow_pickle`` not literally False, on ``pandas.read_pickle``, on an unsafe YAML
load, and on a model's ``from_pretrained`` without ``use_safetensors=True`` (transformers would otherwise
fall back to a pickled ``.bin`` file). The scanner is itself tested on code that does each of these.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "baton"
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal",
                  "torch.serialization"}


def _kw(call: ast.Call, name: str):
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def _is_const(node, value) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def violations(source: str, filename: str = "<src>") -> list[str]:
    tree = ast.parse(source, filename)
    out = []
    aliases: dict[str, str] = {}  # local name -> module or module.attr it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if a.name in PICKLE_MODULES or a.name.split(".")[0] in PICKLE_MODULES:
                    out.append(f"{filename}:{node.lineno}: imports {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            if node.module in PICKLE_MODULES or node.module.split(".")[0] in PICKLE_MODULES:
                out.append(f"{filename}:{node.lineno}: imports from {node.module}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        head, _, rest = name.partition(".")
        full = f"{aliases.get(head, head)}.{rest}" if rest else aliases.get(head, head)
        where = f"{filename}:{node.lineno}"
        if full == "torch.load" and not _is_const(_kw(node, "weights_only"), True):
            out.append(f"{where}: torch.load without weights_only=True")
        if full in ("numpy.load", "np.load"):
            ap = _kw(node, "allow_pickle")
            if ap is not None and not _is_const(ap, False):
                out.append(f"{where}: numpy.load with allow_pickle")
        if full.endswith("read_pickle") or full.endswith("unsafe_load"):
            out.append(f"{where}: {full}")
        loader = _kw(node, "Loader")
        if full in ("yaml.load", "yaml.load_all") and (loader is None or "Safe" not in ast.unparse(loader)):
            out.append(f"{where}: yaml.load without SafeLoader")
        if full.endswith("from_pretrained"):
            owner = full.rsplit(".", 1)[0]
            is_model = "Model" in owner or "ForCausalLM" in owner
            if is_model and not _is_const(_kw(node, "use_safetensors"), True):
                out.append(f"{where}: {owner}.from_pretrained without use_safetensors=True")
    return out


def test_the_package_never_loads_a_pickle():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20  # the scan really covers the package
    found = [v for f in files for v in violations(f.read_text(encoding="utf-8"), str(f.relative_to(PACKAGE.parent)))]
    assert found == []


@pytest.mark.parametrize("bad", [
    "import pickle\npickle.loads(b'')",
    "from pickle import loads",
    "import dill",
    "import torch\ntorch.load('x.pt')",
    "import torch\ntorch.load('x.pt', weights_only=False)",
    "import torch as t\nt.load('x.pt', map_location='cpu')",
    "from torch import load\nload('x.pt')",
    "from torch.serialization import load",
    "import numpy as np\nnp.load('x.npy', allow_pickle=True)",
    "import pandas as pd\npd.read_pickle('x')",
    "import yaml\nyaml.load(open('x'))",
    "from transformers import AutoModelForCausalLM\nAutoModelForCausalLM.from_pretrained('d')",
    "from transformers import LlamaForCausalLM as L\nL.from_pretrained('d', use_safetensors=False)",
])
def test_the_scanner_catches_each_pickle_path(bad):
    assert violations(bad), bad


@pytest.mark.parametrize("good", [
    "import torch\ntorch.load('x.pt', weights_only=True)",
    "import numpy as np\nnp.load('x.npy')",
    "import yaml\nyaml.load(open('x'), Loader=yaml.SafeLoader)",
    "from transformers import AutoModelForCausalLM\nAutoModelForCausalLM.from_pretrained('d', use_safetensors=True)",
    "from transformers import AutoTokenizer\nAutoTokenizer.from_pretrained('d')",
    "from safetensors.torch import load_file\nload_file('x')",
])
def test_the_scanner_passes_safe_loads(good):
    assert violations(good) == []
