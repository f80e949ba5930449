#!/usr/bin/env python3
"""Writes tests/data/grammar/json_schema_golden.json: (schema, instance text,
valid) cases per JSON Schema keyword, `valid` decided by the Python
`jsonschema` package (Draft 2020-12, with its own FORMAT_CHECKER), and schemas
the converter must refuse with the keyword it must name.

Instances are written as json.dumps writes them (", " and ": " separators,
ensure_ascii=False) with properties in schema order: the grammar's form.
Cases where the grammar is deliberately narrower than the schema (1.0 as an
integer, February 29, escapes under a pattern) are not listed.
    python3 tools/make_json_schema_golden.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tools_venv  # noqa: E402

tools_venv.ensure(["jsonschema"], ["jsonschema"])
import jsonschema  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "grammar", "json_schema_golden.json")

# (schema, [instances as Python values or as raw text with "raw:" prefix])
CASES = [
    ({"type": "string"}, ["", "abc", "Zoë \"q\" \\ 中文", 1, None, "raw:\"\\u00e9\\n\"", "raw:\"a\nb\""]),
    ({"type": "integer"}, [0, -7, 123456789, 1.5, "1", "raw:01", "raw:-0", True]),
    ({"type": "number"}, [0, -2.5, 1e10, 3.25e-5, "x", None, "raw:.5", "raw:1."]),
    ({"type": "boolean"}, [True, False, 0, "true"]),
    ({"type": "null"}, [None, 0, "null"]),
    ({"type": ["string", "null"]}, ["a", None, 1]),
    ({"type": ["integer", "boolean"], "minimum": 3}, [3, 99, 2, True, -5]),
    ({"enum": ["red", "green", 3, None, [1, 2], {"a": 1}]}, ["red", "green", 3, None, [1, 2], {"a": 1}, "blue", 4, [2, 1]]),
    ({"const": "fixed"}, ["fixed", "other"]),
    ({"const": {"k": [1, True]}}, [{"k": [1, True]}, {"k": [1, False]}]),
    ({"type": "string", "enum": ["a", 1, "b"]}, ["a", "b", 1]),
    ({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]}, [5, "ab", "abc", None]),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, [5, "x", None]),
    ({"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
         "required": ["kind", "lives"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}},
         "required": ["kind", "good"], "additionalProperties": False}]},
     [{"kind": "cat", "lives": 9}, {"kind": "dog", "good": True}, {"kind": "cat", "good": True}, {"kind": "bird"}]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
      "required": ["a"], "additionalProperties": False},
     [{"a": 1}, {"a": 1, "b": "x"}, {"b": "x"}, {}, {"a": 1, "c": 2}, {"a": "1"}, "raw:{ \"a\" : 1 }",
      "raw:{\n  \"a\": 1,\n  \"b\": \"x\"\n}"]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
      "additionalProperties": False},
     [{}, {"a": 1}, {"b": 2}, {"c": 3}, {"a": 1, "c": 3}, {"a": 1, "b": 2, "c": 3}, {"d": 4}, "raw:{,}",
      "raw:{\"a\": 1,}"]),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
     [{"a": 1}, {"a": 1, "x": [1, {"y": None}]}, {"a": 1, "ab": "z", "b": True}, {"x": 1}]),
    ({"type": "object", "properties": {"id": {"type": "integer"}},
      "additionalProperties": {"type": "string"}},
     [{"id": 1, "x": "s"}, {"id": 1, "x": 2}, {"x": "s", "y": "t"}, {}]),
    ({"type": "object"}, [{}, {"a": {"b": [1, 2, {"c": None}]}}, [], "x"]),
    ({"type": "array", "items": {"type": "integer"}}, [[], [1], [1, 2, 3], [1, "2"], {}, "raw:[1,]"]),
    ({"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 3},
     [["a", "b"], ["a", "b", "c"], ["a"], ["a", "b", "c", "d"], []]),
    ({"type": "array", "maxItems": 1}, [[], [None], [1, 2]]),
    ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
     [[], [1], [1, "a"], [1, "a", 2], ["a"], [1, 2]]),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "boolean"}, "minItems": 2},
     [[1, True], [1, True, False], [1], [1, 2]]),
    ({"type": "string", "minLength": 2, "maxLength": 4}, ["ab", "abcd", "a", "abcde", "ééé", "raw:\"\\n\\t\""]),
    ({"type": "string", "maxLength": 0}, ["", "a"]),
    ({"type": "string", "pattern": "^[a-z]+-[0-9]{2,3}$"}, ["abc-12", "x-999", "abc-1", "ABC-12", "abc-1234", ""]),
    ({"type": "string", "pattern": "ab+c"}, ["abc", "xxabbbcyy", "ac", ""]),
    ({"type": "string", "pattern": "^(\\d{3})-(\\w+|\\s)$"}, ["123-abc_9", "123- ", "12-a", "123-"]),
    ({"type": "string", "pattern": "^[^a-c]\\.$"}, ["d.", "\".", "a.", "dd"]),
    ({"type": "string", "pattern": "^a.c$"}, ["abc", "a\"c", "a\\c", "a\nc", "ac"]),
    ({"type": "string", "format": "date"}, ["2024-01-31", "1999-12-01", "2023-04-30", "2023-04-31", "2024-13-01",
                                            "24-01-01", "2024-1-01"]),
    ({"type": "string", "format": "date-time"}, ["2024-01-31T12:30:00Z", "2024-01-31T23:59:59.123+02:00",
                                                 "2024-01-31T12:30:00", "2024-01-31 12:30:00Z", "2024-01-31T24:00:00Z"]),
    ({"type": "string", "format": "time"}, ["12:30:00Z", "08:00:00+05:30", "12:30Z", "25:00:00Z"]),
    ({"type": "string", "format": "uuid"}, ["123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000",
                                            "123e4567-e89b-12d3-a456-42661417400"]),
    ({"type": "string", "format": "email"}, ["ada@example.com", "a.b+c@mail.example.org", "not-an-email"]),
    ({"type": "integer", "minimum": 10, "maximum": 250}, [10, 99, 100, 250, 9, 251, 1000, -10, 0]),
    ({"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 7}, [-4, 0, 6, -5, 7, -50, 70]),
    ({"type": "integer", "minimum": -120}, [-120, -7, 0, 5, 10000, -121, -1000]),
    ({"type": "integer", "maximum": -3}, [-3, -40, -1000, -2, 0, 5]),
    ({"type": "integer", "maximum": 42}, [42, 0, -99999, 43, 100]),
    ({"type": "integer", "minimum": 1000}, [1000, 9999, 12345, 999, 1, 0, -1000]),
    ({"type": "number", "minimum": 0}, [0, 1.5, 3e2, -1, -0.5]),
    ({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                          "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
                         "required": ["v", "next"], "additionalProperties": False}},
      "$ref": "#/$defs/node"},
     [{"v": 1, "next": None}, {"v": 1, "next": {"v": 2, "next": {"v": 3, "next": None}}}, {"v": 1},
      {"v": 1, "next": {"v": "x", "next": None}}]),
    ({"type": "object", "properties": {"name": {"type": "string"},
                                       "children": {"type": "array", "items": {"$ref": "#"}}},
      "required": ["name", "children"], "additionalProperties": False},
     [{"name": "a", "children": []}, {"name": "a", "children": [{"name": "b", "children": []}]},
      {"name": "a", "children": [{"name": "b"}]}]),
    ({"definitions": {"pos": {"type": "integer", "minimum": 1}}, "type": "array", "items": {"$ref": "#/definitions/pos"}},
     [[1, 2], [0], []]),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     [{"a": 1, "b": "x"}, {"a": 1}, {"b": "x"}, {"a": 1, "b": "x", "c": None}]),
    ({"allOf": [{"$ref": "#/$defs/x"}], "description": "wrapped", "$defs": {"x": {"type": "integer"}}}, [1, "a"]),
    ({"title": "Person", "description": "d", "type": "object", "properties": {
        "name": {"type": "string", "title": "Name"},
        "age": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["name", "age", "role", "tags"], "additionalProperties": False},
     [{"name": "Ada", "age": 36, "role": "admin", "tags": ["x"]}, {"name": "Ada", "age": None, "role": "user", "tags": []},
      {"name": "Ada", "age": 36, "role": "root", "tags": []}, {"name": "Ada", "role": "user", "tags": []}]),
    ({}, [1, "x", None, {"a": [1]}, "raw:nul"]),
    (True, [1, [], {}]),
]

UNSUPPORTED = [
    ({"type": "integer", "multipleOf": 3}, "'multipleOf' at # is not supported"),
    ({"type": "object", "patternProperties": {"^x": {}}}, "'patternProperties' at #"),
    ({"type": "object", "properties": {"a": {"type": "string", "contentEncoding": "base64"}}},
     "'contentEncoding' at #/properties/a"),
    ({"type": "array", "uniqueItems": True}, "'uniqueItems' at #"),
    ({"type": "array", "contains": {"type": "integer"}}, "'contains' at #"),
    ({"type": "object", "minProperties": 1}, "'minProperties' at #"),
    ({"not": {"type": "string"}}, "'not' at #"),
    ({"if": {"type": "string"}, "then": {}}, "'if' at #"),
    ({"type": "number", "minimum": 1.5}, "'minimum' at #"),
    ({"type": "number", "maximum": 10}, "'maximum' at #"),
    ({"type": "string", "format": "ipv4"}, "'format' at # is not supported"),
    ({"type": "string", "pattern": "(a)\\1"}, "backreferences"),
    ({"type": "string", "pattern": "a(?=b)"}, "lookaround"),
    ({"type": "string", "pattern": "\\bword"}, "word boundaries"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "'oneOf' at #"),
    ({"$ref": "https://example.com/s.json"}, "$ref 'https://example.com/s.json'"),
    ({"$ref": "#/$defs/missing"}, "does not resolve"),
    ({"type": "strin"}, "type 'strin' at #"),
    (False, "schema false at #"),
    ({"type": "string", "pattern": "[a-z]", "maxLength": 3}, "'pattern' at #"),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                {"type": "object", "properties": {"a": {"type": "string"}}}]}, "property 'a'"),
    ({"type": "array", "maxItems": 20000}, "'maxItems' at #"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "'required' at #"),
]


def main():
    cases = []
    n_valid = 0
    for schema, instances in CASES:
        validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        for inst in instances:
            if isinstance(inst, str) and inst.startswith("raw:"):
                text = inst[4:]
                try:
                    value = json.loads(text)
                    valid = validator.is_valid(value)
                except json.JSONDecodeError:
                    valid = False
            else:
                text = json.dumps(inst, ensure_ascii=False)
                valid = validator.is_valid(inst)
            n_valid += valid
            cases.append({"schema": schema, "instance": text, "valid": valid})
    out = {"generator": "tools/make_json_schema_golden.py", "jsonschema": jsonschema.__dict__.get("__version__", "")
           if False else "Draft202012Validator + its FORMAT_CHECKER",
           "cases": cases, "unsupported": [{"schema": s, "error_contains": e} for s, e in UNSUPPORTED]}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{OUT}: {len(cases)} cases ({n_valid} valid), {len(UNSUPPORTED)} unsupported schemas")


if __name__ == "__main__":
    main()
