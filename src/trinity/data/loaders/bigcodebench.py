"""BigCodeBench and BigCodeBench-Hard (grader "code", unittest format), with the upstream data fixes."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable

from trinity.data.loaders.reading import DataError, PathLike, check_unique, field, iter_jsonl, nonempty, read_json, require_file
from trinity.records import Task

# BigCodeBench: the staged file is v0.1.0_hf. These are the upstream data fixes up to v0.1.5
# (bigcode-project/bigcodebench tools/fix_v019.py → v0.1.1, fix_v0110.py → v0.1.2, fix_v022.py → v0.1.3,
# fix_v023.py → v0.1.4, fix_v025.py → v0.1.5), re-applied as exact text edits. Each edit is idempotent:
# a record that already carries the new text (a newer download) is left alone.
BIGCODEBENCH_VERSIONS = ("v0.1.0_hf", "v0.1.1", "v0.1.2", "v0.1.3", "v0.1.4", "v0.1.5")
_PROMPT_KEYS = ("complete_prompt", "instruct_prompt", "code_prompt")
_CODE_START = "\nYou should write self-contained code starting with:\n```\n"


def _replace(rec: dict, keys, old: str, new: str) -> None:
    for k in keys:
        v = rec.get(k)
        # When `new` extends `old`, a record that already has `new` is patched already; otherwise
        # replacing removes every `old`, so a second pass finds nothing to do.
        if isinstance(v, str) and old in v and not (old in new and new in v):
            rec[k] = v.replace(old, new)


def _prepend(rec: dict, keys, prefix: str) -> None:
    for k in keys:
        v = rec.get(k)
        if isinstance(v, str) and not v.startswith(prefix):
            rec[k] = prefix + v


def _nltk_fix(rec: dict, download: str, *, instruct: bool = True) -> None:
    line = f"import nltk\nnltk.download('{download}')\n"
    _prepend(rec, ("code_prompt", "complete_prompt"), line)
    if instruct:
        _replace(rec, ("instruct_prompt",), _CODE_START, _CODE_START + line)


def _fix_1006(rec: dict) -> None:
    old = (
        '    def test_valid_zip_url(self):\n        """Test a valid ZIP URL."""\n'
        '        url = "https://getsamplefiles.com/download/zip/sample-1.zip"\n        result = task_func(url)\n'
        '        self.assertTrue(result.startswith("mnt/data/downloads/"))\n'
        '        self.assertTrue(result.endswith("sample-1"))\n        shutil.rmtree("mnt/data/downloads")\n'
    )
    new = (
        '    @patch("requests.get")\n    def test_non_zip_content(self, mock_get):\n        """Test a valid ZIP URL."""\n'
        "        mock_get.return_value.status_code = 200\n"
        '        mock_get.return_value.headers = {"Content-Type": "application/zip"}\n'
        '        mock_get.return_value.content = b"1"\n        url = "https://valid-url.com/sample.zip"\n'
        "        result = task_func(url)\n"
    )
    _replace(rec, ("test",), old, new)


def _fix_211_215(rec: dict) -> None:
    if rec["task_id"] == "BigCodeBench/211":
        old = "\n        mock_response = MagicMock()\n        mock_response.content = MOCK_CONTENT\n"
        _replace(rec, ("test",), old, old + "        mock_response.status_code = 200\n")
    elif "mock_response.json = lambda: json.loads(MOCK_TEXT)" not in rec["test"]:  # 215, not yet patched
        # (the three edits interact — the third re-creates the second's pattern — so guard them as a unit)
        _replace(rec, ("test",), "\n        mock_response = Mock()\n",
                 "\n        mock_response = Mock()\n        mock_response.status_code = 200\n")
        _replace(rec, ("test",), "\n        mock_response.text =", "\n        MOCK_TEXT =")
        _replace(rec, ("test",), "\n        mock_get.return_value = mock_response\n",
                 "\n        mock_response.text = MOCK_TEXT\n        mock_response.json = lambda: json.loads(MOCK_TEXT)\n"
                 "        mock_get.return_value = mock_response\n")
    if rec["task_id"] == "BigCodeBench/215":
        _replace(rec, ("complete_prompt", "instruct_prompt", "doc_struct"), "Thif function will raise",
                 "This function will raise")


def _fix_1005(rec: dict) -> None:
    keys = [k for k, v in rec.items() if isinstance(v, str)]
    _replace(rec, keys, "https://getsamplefiles.com/download/zip/sample-2.zip",
             "https://getsamplefiles.com/download/zip/sample-5.zip")
    _replace(rec, keys, "sample_2", "sample_5")
    _replace(rec, keys, "Sample 2", "Sample 5")


def _fix_37(rec: dict) -> None:
    # Upstream prepends the import to every *prompt* field, instruct_prompt included.
    _prepend(rec, _PROMPT_KEYS, "import pandas as pd\n")
    _replace(rec, _PROMPT_KEYS, "Requirements:\n    - sklearn.ensemble\n",
             "Requirements:\n    - pandas\n    - sklearn.ensemble\n")


_BCB_PATCHES: list[tuple[str, str, Callable[[dict], None]]] = [
    ("v0.1.1", "BigCodeBench/178", lambda r: (_replace(r, [k for k, v in r.items() if isinstance(v, str)],
                                                          "from urllib import request\n", ""),
                                              _replace(r, [k for k, v in r.items() if isinstance(v, str)],
                                                       "    - urllib.request\n", ""))),
    ("v0.1.1", "BigCodeBench/760", lambda r: _replace(r, _PROMPT_KEYS, "from datetime import datetime",
                                                      "import datetime")),
    ("v0.1.1", "BigCodeBench/1006", _fix_1006),
    ("v0.1.2", "BigCodeBench/37", _fix_37),
    ("v0.1.3", "BigCodeBench/211", _fix_211_215),
    ("v0.1.3", "BigCodeBench/215", _fix_211_215),
    ("v0.1.3", "BigCodeBench/1005", _fix_1005),
    ("v0.1.5", "BigCodeBench/332", lambda r: _nltk_fix(r, "stopwords")),
    ("v0.1.5", "BigCodeBench/334", lambda r: _nltk_fix(r, "punkt")),
    ("v0.1.5", "BigCodeBench/376", lambda r: (
        _replace(r, ("code_prompt", "complete_prompt"), "import nltk\n", "import nltk\nnltk.download('stopwords')\n"),
        _replace(r, ("instruct_prompt",), _CODE_START + "import nltk\n",
                 _CODE_START + "import nltk\nnltk.download('stopwords')\n"))),
    ("v0.1.5", "BigCodeBench/383", lambda r: _nltk_fix(r, "punkt")),
    ("v0.1.5", "BigCodeBench/633", lambda r: _nltk_fix(r, "stopwords", instruct=False)),  # upstream: no-op on instruct
    ("v0.1.5", "BigCodeBench/635", lambda r: _replace(
        r, _PROMPT_KEYS, "# Importing the required libraries",
        "# Importing the required libraries\nimport nltk\nnltk.download('stopwords')\n")),
    ("v0.1.5", "BigCodeBench/849", lambda r: _nltk_fix(r, "stopwords", instruct=False)),
    ("v0.1.5", "BigCodeBench/940", lambda r: _nltk_fix(r, "punkt")),
    ("v0.1.5", "BigCodeBench/1109", lambda r: _nltk_fix(r, "punkt")),
]


def _patch_bigcodebench(rec: dict, version: str) -> dict:
    target = BIGCODEBENCH_VERSIONS.index(version)
    for v, tid, fix in _BCB_PATCHES:
        if rec["task_id"] == tid and BIGCODEBENCH_VERSIONS.index(v) <= target:
            fix(rec)
    return rec


def _bcb_records(root: PathLike, version: str) -> tuple[Path, list[tuple[int, dict]]]:
    if version not in BIGCODEBENCH_VERSIONS:
        raise ValueError(f"bigcodebench version must be one of {BIGCODEBENCH_VERSIONS}, got {version!r}")
    path = require_file(root, "bigcodebench", "bigcodebench-annotation", "hf_data", "BigCodeBench.jsonl.gz")
    out = []
    for n, rec in iter_jsonl(path, gz=True):
        where = f"{path}: line {n}"
        tid = nonempty(field(rec, "task_id", str, where), "task_id", where)
        where = f"{where} ({tid})"
        for k in ("complete_prompt", "instruct_prompt", "code_prompt", "test", "entry_point", "canonical_solution"):
            nonempty(field(rec, k, str, where), k, where)
        if "class TestCases" not in rec["test"]:
            raise DataError(f"{where}: test code defines no TestCases class")
        out.append((n, _patch_bigcodebench(dict(rec), version)))
    return path, out


def _bcb_task(source: str, rec: dict, prompt_style: str, version: str, where: str) -> Task:
    tid = rec["task_id"]
    libs = rec.get("libs")
    if isinstance(libs, str):
        try:
            libs = ast.literal_eval(libs)
        except (ValueError, SyntaxError):
            raise DataError(f"{where}: 'libs' is not a list literal") from None
    prompt = rec["instruct_prompt"] if prompt_style == "instruct" else (
        "Complete the following Python function. Reply with the whole program (imports, the function and any "
        f"helpers) in one ```python code block.\n\n```python\n{rec['complete_prompt'].rstrip()}\n```"
    )
    return Task(
        id=f"{source}/{tid}",
        source=source,
        prompt=(prompt,),
        grader="code",
        tests=rec["test"],
        metadata={
            "task_id": tid,
            "test_format": "unittest",
            "entry_point": rec["entry_point"],
            "code_prompt": rec["code_prompt"],
            "libs": list(libs or []),
            "prompt_style": prompt_style,
            "version": version,
            "reference_solution": rec["code_prompt"] + rec["canonical_solution"],
        },
    )


def load_bigcodebench(root: PathLike, *, prompt_style: str = "instruct", version: str = "v0.1.5") -> list[Task]:
    """BigCodeBench full (1140), staged as v0.1.0_hf and patched up to `version` (see _BCB_PATCHES).
    prompt_style "instruct" (natural-language task, the chat setting) or "complete" (docstring completion)."""
    if prompt_style not in ("instruct", "complete"):
        raise ValueError(f"prompt_style must be 'instruct' or 'complete', got {prompt_style!r}")
    path, recs = _bcb_records(root, version)
    return check_unique([_bcb_task("bigcodebench", r, prompt_style, version, f"{path}: line {n}")
                          for n, r in recs], path)


def load_bigcodebench_hard(root: PathLike, *, prompt_style: str = "instruct", version: str = "v0.1.5") -> list[Task]:
    """BigCodeBench-Hard (148): the full-set records whose ids are in derived/bigcodebench_hard_task_ids.json."""
    if prompt_style not in ("instruct", "complete"):
        raise ValueError(f"prompt_style must be 'instruct' or 'complete', got {prompt_style!r}")
    ids_path = require_file(root, "bigcodebench", "derived", "bigcodebench_hard_task_ids.json")
    ids = read_json(ids_path)
    if not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
        raise DataError(f"{ids_path}: expected a JSON list of task id strings")
    if len(set(ids)) != len(ids):
        raise DataError(f"{ids_path}: duplicate task ids")
    path, recs = _bcb_records(root, version)
    by_id = {r["task_id"]: (n, r) for n, r in recs}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise DataError(f"{ids_path}: ids not in {path}: {missing[:5]}")
    return [_bcb_task("bigcodebench_hard", by_id[i][1], prompt_style, version, f"{path}: line {by_id[i][0]}")
            for i in sorted(ids, key=lambda s: int(s.rsplit("/", 1)[-1]))]
