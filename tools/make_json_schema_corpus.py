#!/usr/bin/env python3
"""Writes tests/data/grammar/schema_corpus.json: 240 JSON Schemas of the
shape function-calling tools and structured-output requests have (objects
of typed properties, required and optional, enums, patterns, formats,
ranges, nullable unions, arrays of objects, $defs / $ref, recursive trees,
tagged oneOf, tuples), generated from a fixed seed, each with instances and
non-instances decided by the Python `jsonschema` package (Draft 2020-12 and
its FORMAT_CHECKER), plus 40 schemas that carry one keyword the converter
refuses (at a nested path), with the keyword and path its error must name.

tests/text/grammar/schema_corpus_test.cpp holds the grammars to it: every
schema compiles, accepts its instances (written as json.dumps writes them,
properties in schema order: the grammar's form), rejects its non-instances,
and its random walks parse; tests/integration/test_schema_corpus.py has
jsonschema validate those walks.
    python3 tools/make_json_schema_corpus.py
"""
import copy
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tools_venv  # noqa: E402

tools_venv.ensure(["jsonschema"], ["jsonschema"])
import jsonschema  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "grammar", "schema_corpus.json")
N_SCHEMAS, N_UNSUPPORTED = 240, 40

WORDS = ["city", "name", "query", "title", "email", "user_id", "date", "limit", "offset", "tags", "unit", "status",
         "priority", "note", "url", "lang", "country", "amount", "currency", "items", "address", "phone", "start",
         "end", "kind", "label", "owner", "score", "count", "enabled", "path", "branch", "message", "severity"]
ENUMS = [["celsius", "fahrenheit"], ["low", "medium", "high"], ["open", "closed", "pending"], ["asc", "desc"],
         ["USD", "EUR", "GBP", "JPY"], ["en", "fr", "de", "es", "zh"], ["GET", "POST", "PUT", "DELETE"]]
PATTERNS = [("^[A-Z]{3}$", "EUR"), ("^\\d{5}(-\\d{4})?$", "75001"), ("^[a-z0-9_]+$", "user_42"),
            ("^\\+?[0-9]{7,15}$", "+33123456789"), ("^#[0-9a-fA-F]{6}$", "#1a2B3c"), ("^v\\d+\\.\\d+\\.\\d+$", "v1.2.3"),
            ("^[A-Z]{2}-\\d{3,5}$", "FR-1234")]
FORMATS = [("date", "2024-02-28"), ("date-time", "2024-07-26T09:30:00Z"), ("time", "09:30:00+02:00"),
           ("uuid", "123e4567-e89b-12d3-a456-426614174000"), ("email", "ana.lopez@example.org")]
TEXTS = ["Paris", "hello world", "caf\u00e9 \"quoted\"", "line\nbreak", "", "\u4e2d\u6587", "a/b\\c"]
UNSUPPORTED = [({"type": "integer", "multipleOf": 5}, "multipleOf"), ({"not": {"type": "null"}}, "not"),
               ({"type": "object", "patternProperties": {"^x-": {"type": "string"}}}, "patternProperties"),
               ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
               ({"type": "array", "contains": {"type": "integer"}}, "contains"),
               ({"type": "object", "minProperties": 1}, "minProperties"),
               ({"type": "object", "maxProperties": 3}, "maxProperties"),
               ({"if": {"type": "string"}, "then": {"minLength": 1}}, "if"),
               ({"type": "string", "format": "ipv4"}, "format"), ({"type": "number", "maximum": 99.5}, "maximum"),
               ({"type": "object", "propertyNames": {"maxLength": 3}}, "propertyNames"),
               ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
               ({"type": "string", "contentMediaType": "text/html"}, "contentMediaType"),
               ({"type": "object", "unevaluatedProperties": False}, "unevaluatedProperties")]


class Gen:
    def __init__(self, rng):
        self.rng = rng
        self.defs = {}

    def name(self, used):
        while True:
            w = self.rng.choice(WORDS)
            if w not in used:
                return w

    def leaf(self):
        r = self.rng.random()
        if r < 0.22:
            return {"type": "string", "description": "free text"}
        if r < 0.36:
            return {"type": "string", "enum": list(self.rng.choice(ENUMS))}
        if r < 0.44:
            p = self.rng.choice(PATTERNS)
            return {"type": "string", "pattern": p[0]}
        if r < 0.52:
            return {"type": "string", "format": self.rng.choice(FORMATS)[0]}
        if r < 0.58:
            lo = self.rng.randint(0, 3)
            return {"type": "string", "minLength": lo, "maxLength": lo + self.rng.randint(2, 40)}
        if r < 0.70:
            s = {"type": "integer"}
            if self.rng.random() < 0.7:
                s["minimum"] = self.rng.choice([0, 1, -10])
            if self.rng.random() < 0.6:
                s["maximum"] = self.rng.choice([10, 100, 1000, 65535])
            return s
        if r < 0.77:
            return {"type": "number", "minimum": 0} if self.rng.random() < 0.5 else {"type": "number"}
        if r < 0.84:
            return {"type": "boolean"}
        if r < 0.90:
            inner = self.leaf()
            if "type" in inner and isinstance(inner["type"], str) and "enum" not in inner:
                inner["type"] = [inner["type"], "null"]
                return inner
            return {"anyOf": [inner, {"type": "null"}]}
        if r < 0.95:
            return {"const": self.rng.choice(["v1", 2, True])}
        return {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}], "items": False}

    def obj(self, depth, n_min=1, n_max=6):
        props, used = {}, set()
        for _ in range(self.rng.randint(n_min, n_max)):
            k = self.name(used)
            used.add(k)
            r = self.rng.random()
            if depth > 0 and r < 0.15:
                props[k] = self.obj(depth - 1, 1, 3)
            elif depth > 0 and r < 0.30:
                items = self.obj(depth - 1, 1, 3) if self.rng.random() < 0.5 else self.leaf()
                a = {"type": "array", "items": items}
                if self.rng.random() < 0.5:
                    a["minItems"] = self.rng.randint(0, 1)
                    a["maxItems"] = a["minItems"] + self.rng.randint(1, 5)
                props[k] = a
            elif depth > 0 and r < 0.38:
                d = "D" + str(len(self.defs))
                self.defs[d] = None  # taken before the body adds its own
                self.defs[d] = self.obj(depth - 1, 1, 3)
                props[k] = {"$ref": "#/$defs/" + d}
            else:
                props[k] = self.leaf()
        s = {"type": "object", "properties": props}
        req = [k for k in props if self.rng.random() < 0.6]
        if req:
            s["required"] = req
        s["additionalProperties"] = False if self.rng.random() < 0.7 else True
        return s

    def schema(self, i):
        self.defs = {}
        kind = i % 10
        if kind == 7:  # recursive tree
            node = {"type": "object", "properties": {"label": {"type": "string"},
                                                     "children": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                                  "maxItems": 3}},
                    "required": ["label", "children"], "additionalProperties": False}
            return {"$defs": {"node": node}, "type": "object",
                    "properties": {"root": {"$ref": "#/$defs/node"}, "depth": {"type": "integer", "minimum": 0}},
                    "required": ["root"], "additionalProperties": False}
        if kind == 8:  # tagged union
            branches = []
            for tag in self.rng.sample(["email", "sms", "push", "call"], 2):
                b = self.obj(0, 1, 3)
                b["properties"] = {"channel": {"const": tag}, **b["properties"]}
                b["required"] = ["channel"] + [r for r in b.get("required", []) if r != "channel"]
                b["additionalProperties"] = False
                branches.append(b)
            return {"type": "object", "properties": {"notify": {"oneOf": branches}}, "required": ["notify"],
                    "additionalProperties": False}
        s = self.obj(2)
        if self.defs:
            s = {"$defs": self.defs, **s}
        return s


def resolve(schema, root):
    while "$ref" in schema:
        schema = root["$defs"][schema["$ref"].split("/")[-1]]
    return schema


class Instances:
    """Values of a schema (what the grammar may write), from a seeded rng."""

    def __init__(self, rng, root):
        self.rng, self.root = rng, root

    def value(self, s, depth=0):
        s = resolve(s, self.root)
        if "const" in s:
            return s["const"]
        if "enum" in s:
            return self.rng.choice(s["enum"])
        if "anyOf" in s or "oneOf" in s:
            return self.value(self.rng.choice(s.get("anyOf") or s.get("oneOf")), depth)
        t = s.get("type")
        if isinstance(t, list):
            t = self.rng.choice(t)
        if t == "null":
            return None
        if t == "boolean":
            return self.rng.random() < 0.5
        if t == "integer":
            return self.rng.randint(s.get("minimum", -50), s.get("maximum", 5000))
        if t == "number":
            return round(self.rng.uniform(s.get("minimum", -100), 1000), 2)
        if t == "string":
            if "pattern" in s:
                return dict(PATTERNS)[s["pattern"]]
            if "format" in s:
                return dict(FORMATS)[s["format"]]
            text = self.rng.choice(TEXTS)
            lo, hi = s.get("minLength", 0), s.get("maxLength", 1000)
            text = (text + "xxxx")[:max(lo, min(hi, len(text)))]
            return text
        if t == "array":
            if "prefixItems" in s:
                return [self.value(p, depth) for p in s["prefixItems"]]
            lo, hi = s.get("minItems", 0), s.get("maxItems", 3)
            n = self.rng.randint(lo, min(hi, lo + 2)) if depth < 4 else lo
            return [self.value(s["items"], depth + 1) for _ in range(n)]
        if t == "object":
            out = {}
            for k, p in s.get("properties", {}).items():
                if k in s.get("required", []) or (depth < 4 and self.rng.random() < 0.5):
                    out[k] = self.value(p, depth + 1)
            return out
        raise ValueError(f"no value for {s}")


def mutations(rng, schema, instance):
    """Instances made invalid in one place (wrong type, missing required,
    out of enum or range, extra property, bad pattern or format)."""
    root = schema
    out = []

    def walk(s, v, path):
        s = resolve(s, root)
        if isinstance(v, dict) and s.get("type") == "object":
            for k in s.get("required", []):
                if k in v:
                    out.append((path, "drop", k))
            if s.get("additionalProperties") is False:
                out.append((path, "extra", None))
            for k, sub in s.get("properties", {}).items():
                if k in v:
                    out.append((path + [k], "retype", None))
                    walk(sub, v[k], path + [k])
        elif isinstance(v, list) and "items" in s and isinstance(s["items"], dict):
            for i, x in enumerate(v):
                walk(s["items"], x, path + [i])

    walk(schema, instance, [])
    rng.shuffle(out)
    for path, op, arg in out:
        bad = copy.deepcopy(instance)
        parent = bad
        for p in path[:-1] if op == "retype" else path:
            parent = parent[p]
        if op == "drop":
            del parent[arg]
        elif op == "extra":
            parent["zz_extra"] = 1
        else:
            old = parent[path[-1]]
            parent[path[-1]] = {str: 12345, int: "7", float: "7.5", bool: "true", type(None): "null", list: {},
                                dict: "obj"}[type(old)]
        yield bad


def text(v):
    return json.dumps(v, ensure_ascii=False)


def main():
    rng = random.Random(20261202)
    gen = Gen(rng)
    cases = []
    for i in range(N_SCHEMAS):
        schema = gen.schema(i)
        validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        jsonschema.Draft202012Validator.check_schema(schema)
        inst = Instances(rng, schema)
        valid, seen = [], set()
        for _ in range(12):
            v = inst.value(schema)
            if text(v) in seen:
                continue
            seen.add(text(v))
            errors = list(validator.iter_errors(v))
            assert not errors, (schema, v, errors[0].message)
            valid.append(text(v))
            if len(valid) == 3:
                break
        invalid = []
        for bad in mutations(rng, schema, json.loads(valid[-1])):
            if not validator.is_valid(bad) and text(bad) not in invalid:
                invalid.append(text(bad))
            if len(invalid) == 3:
                break
        cases.append({"schema": schema, "instances": valid, "non_instances": invalid})
    unsupported = []
    for i in range(N_UNSUPPORTED):
        gen.defs = {}
        schema = gen.obj(1, 2, 4)
        if gen.defs:
            schema = {"$defs": gen.defs, **schema}
        bad, keyword = UNSUPPORTED[i % len(UNSUPPORTED)]
        key = "z_" + str(i)
        schema["properties"][key] = copy.deepcopy(bad)
        jsonschema.Draft202012Validator.check_schema(schema)
        unsupported.append({"schema": schema, "keyword": keyword, "path": "#/properties/" + key})
    n_valid = sum(len(c["instances"]) for c in cases)
    n_invalid = sum(len(c["non_instances"]) for c in cases)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"generator": "tools/make_json_schema_corpus.py",
                   "jsonschema": "Draft202012Validator + its FORMAT_CHECKER", "cases": cases,
                   "unsupported": unsupported},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{OUT}: {len(cases)} schemas, {n_valid} instances, {n_invalid} non-instances, "
          f"{len(unsupported)} unsupported")


if __name__ == "__main__":
    main()
