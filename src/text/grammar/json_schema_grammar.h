#pragma once
// JSON Schema (and the other structured-output requests) to GBNF.
//
// Supported: everything OpenAI strict mode accepts and the common rest:
// type (one or a list), enum, const, anyOf, oneOf (when its branches are
// provably disjoint: different types, or objects told apart by a required
// const/enum property), allOf of object schemas, $ref to "#", "#/$defs/..."
// or "#/definitions/..." (recursion included), properties / required /
// additionalProperties (bool or schema), items, prefixItems, minItems,
// maxItems, string minLength / maxLength / pattern / format (date, time,
// date-time, uuid, email), integer minimum / maximum / exclusiveMinimum /
// exclusiveMaximum, number minimum / exclusiveMinimum of 0. Annotations
// (title, description, default, examples, $schema, $id, $comment,
// deprecated, readOnly, writeOnly, discriminator) are ignored. Any other
// keyword, or a value of a supported one the grammar cannot enforce, is an
// error naming the keyword and where it is ("json_schema: 'multipleOf' at
// #/properties/n is not supported"): never silently relaxed.
//
// The grammar may be narrower than the schema, never wider: properties come
// in the schema's order (additional ones after them), strings under pattern
// or format use the shortest escapes, "integer" means no fraction or
// exponent, date days go to 28 in February, email is the common
// local@domain.tld shape, numbers have at most 18 integer digits (19 for a
// minimum that has as many) and 2 exponent digits (so any JSON reader
// takes them). Whitespace between tokens:
// nothing, one space, or one newline and up to 20 spaces or tabs.
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/result.h"

namespace rill::grammar {

// Any JSON object (response_format json_object).
std::string json_object_gbnf();
// Any JSON value.
std::string json_value_gbnf();
// Properties keep the order they have in `schema`.
Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema);
// Exactly one of the strings (the `choice` field).
Result<std::string> choice_gbnf(const std::vector<std::string>& choices);

}  // namespace rill::grammar
