"""What the JSON Schema grammars produce, validated by the Python
`jsonschema` package: tests/text/grammar/schema_corpus_test.cpp random-walks
the grammar of each of the 240 schemas of tests/data/grammar/schema_corpus.json
(tools/make_json_schema_corpus.py) and writes the walks out; every walk must
be an instance of its schema (Draft 2020-12 with its FORMAT_CHECKER)."""
import json
import os
import subprocess

import jsonschema
import pytest

from conftest import RILL, ROOT

TEST_BINARY = os.path.join(os.path.dirname(RILL), "tests", "test_text_schema_corpus_test")


@pytest.mark.skipif(bool(os.environ.get("RILL_SANITIZED")),
                    reason="the sanitized binary walks every 4th schema (tests/sanitizer_stride.h); the Release run "
                    "validates them all, and the sanitized ctest runs the same walks")
def test_every_grammar_walk_is_a_schema_instance(tmp_path):
    walks_path = tmp_path / "walks.jsonl"
    env = dict(os.environ, RILL_SCHEMA_WALKS_OUT=str(walks_path))
    run = subprocess.run([TEST_BINARY, "--gtest_filter=SchemaCorpus.EverySchemaCompiles*"], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    with open(os.path.join(ROOT, "tests", "data", "grammar", "schema_corpus.json"), encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    walks = [json.loads(line) for line in walks_path.read_text(encoding="utf-8").splitlines()]
    assert len(walks) >= len(cases)
    covered = set()
    for w in walks:
        schema = cases[w["case"]]["schema"]
        validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        errors = list(validator.iter_errors(json.loads(w["text"])))
        assert not errors, f"case {w['case']}: {w['text']!r}: {errors[0].message}"
        covered.add(w["case"])
    assert len(covered) >= 0.95 * len(cases)
