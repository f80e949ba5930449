// Filters over sequences and mappings: select/map/sort/unique/join/...,
// with jinja2's attribute getters and case-insensitive ordering.
#include <algorithm>

#include "text/jinja_filters_impl.h"
#include "text/jinja_string.h"

namespace rill::jinja::filters {
namespace {

// jinja's make_attrgetter: "a.b.0" looks up each dotted part as an item
// (integer parts as indexes); Undefined results fall back to `dflt`.
Result<Value> attribute_of(Interpreter& in, const Value& item, const Value& attribute, const Value* dflt) {
  Value cur = item;
  if (attribute.kind != Kind::kString) {
    RILL_ASSIGN_OR_RETURN(cur, in.get_item(cur, attribute));
  } else {
    for (const std::string& part : py_split(attribute.s(), std::string("."), -1, false)) {
      const bool is_index = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
      const Value key = is_index && part.size() < 18 ? Value::integer(std::stoll(part)) : Value::string(part);
      RILL_ASSIGN_OR_RETURN(cur, in.get_item(cur, key));
    }
  }
  if (cur.is_undefined() && dflt) return *dflt;
  return cur;
}

Value ignore_case(const Value& v) {
  return v.kind == Kind::kString ? Value::string(py_lower_str(v.s())) : v;
}

// Sort keys of `items` (attribute lookup and case folding as the filters ask).
Result<List> sort_keys(Interpreter& in, const List& items, const CallArgs& a, size_t attr_index, size_t case_index) {
  const Value* attribute = a.get(attr_index, "attribute");
  const bool case_sensitive = arg_true(a, case_index, "case_sensitive");
  List keys;
  keys.reserve(items.size());
  for (const auto& item : items) {
    Value key = item;
    if (attribute && !attribute->is_none()) {
      RILL_ASSIGN_OR_RETURN(key, attribute_of(in, item, *attribute, nullptr));
    }
    keys.push_back(case_sensitive ? key : ignore_case(key));
  }
  return keys;
}

// Stable order of indexes by keys; reverse keeps equal items in input order.
Result<std::vector<size_t>> sorted_order(const List& keys, bool reverse) {
  std::vector<size_t> order(keys.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  Status failed;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    if (!failed.ok()) return false;
    auto lt = reverse ? less_than(keys[y], keys[x]) : less_than(keys[x], keys[y]);
    if (!lt.ok()) {
      failed = lt.error();
      return false;
    }
    return lt.value();
  });
  RILL_TRY(failed);
  return order;
}

Result<Value> min_max(Interpreter& in, const Value& v, const CallArgs& a, bool want_max) {
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  RILL_ASSIGN_OR_RETURN(List keys, sort_keys(in, items, a, 1, 0));
  size_t best = 0;
  for (size_t k = 1; k < items.size(); ++k) {
    RILL_ASSIGN_OR_RETURN(bool better, want_max ? less_than(keys[best], keys[k]) : less_than(keys[k], keys[best]));
    if (better) best = k;
  }
  return items[best];
}

constexpr int kMaxGeneratorChain = 200;  // generators pulling through generators

Result<Value> make_generator(const Value& source, Generator::Step step) {
  const int chain = generator_chain(source) + 1;
  if (chain > kMaxGeneratorChain) return Error{"too many nested generators"};
  return Value::generator(std::make_shared<Generator>(std::move(step), chain));
}

// jinja's select_or_reject: a generator that, on the first pull, returns
// nothing for a falsy input and otherwise resolves its test.
Result<Value> select_impl(Interpreter& in, const Value& v, const CallArgs& a, bool keep, bool by_attr) {
  Interpreter* interp = &in;
  bool started = false;
  Generator::Step pull;
  Value attribute;
  std::string test_name;
  CallArgs test_args;
  return make_generator(v, [=]() mutable -> Result<std::optional<Value>> {
    if (!started) {
      started = true;
      if (!truthy(v)) return std::optional<Value>();
      size_t next = 0;
      if (by_attr) {
        if (a.positional.empty()) return Error{"Missing parameter for attribute name"};
        attribute = a.positional[next++];
      }
      if (next < a.positional.size()) {
        if (a.positional[next].kind != Kind::kString) return Error{"test name must be a string"};
        test_name = a.positional[next++].s();
        test_args.positional.assign(a.positional.begin() + long(next), a.positional.end());
        test_args.keyword = a.keyword;
      }
      pull = iterator_of(v);
    }
    if (!pull) return std::optional<Value>();
    while (true) {
      RILL_ASSIGN_OR_RETURN(std::optional<Value> item, pull());
      if (!item) return item;
      Value subject = *item;
      if (by_attr) {
        RILL_ASSIGN_OR_RETURN(subject, attribute_of(*interp, *item, attribute, nullptr));
      }
      bool ok = truthy(subject);
      if (!test_name.empty()) {
        RILL_ASSIGN_OR_RETURN(ok, interp->test(test_name, subject, test_args));
      }
      if (ok == keep) return item;
    }
  });
}

}  // namespace

Result<Value> f_batch(Interpreter& in, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(int64_t n, arg_int(a, 0, "linecount", 0));
  if (n <= 0) return Error{"batch size must be positive"};
  RILL_TRY(in.check_items(size_t(n)));
  const Value fill = a.get(1, "fill_with") ? *a.get(1, "fill_with") : Value::none();
  Generator::Step pull;
  bool finished = false;
  return make_generator(v, [=]() mutable -> Result<std::optional<Value>> {
    if (finished) return std::optional<Value>();
    if (!pull) pull = iterator_of(v);
    List row;
    while (int64_t(row.size()) < n) {
      RILL_ASSIGN_OR_RETURN(std::optional<Value> item, pull());
      if (!item) {
        finished = true;
        break;
      }
      row.push_back(std::move(*item));
    }
    if (row.empty()) return std::optional<Value>();
    if (finished && !fill.is_none())
      while (int64_t(row.size()) < n) row.push_back(fill);
    return std::optional<Value>(Value::make_list(std::move(row)));
  });
}

Result<Value> f_dictsort(Interpreter&, const Value& v, const CallArgs& a) {
  if (v.kind != Kind::kDict) return Error{"dictsort requires a mapping, not " + type_name(v)};
  const bool case_sensitive = arg_true(a, 0, "case_sensitive");
  const Value* by = a.get(1, "by");
  const bool by_value = by && by->kind == Kind::kString && by->s() == "value";
  if (by && !(by->kind == Kind::kString && (by->s() == "key" || by->s() == "value")))
    return Error{"You can only sort by either \"key\" or \"value\""};
  List keys, pairs;
  for (const auto& [k, val] : v.dict->items) {
    const Value& key = by_value ? val : k;
    keys.push_back(case_sensitive ? key : ignore_case(key));
    pairs.push_back(Value::make_tuple({k, val}));
  }
  RILL_ASSIGN_OR_RETURN(auto order, sorted_order(keys, arg_true(a, 2, "reverse")));
  List out;
  for (size_t i : order) out.push_back(pairs[i]);
  return Value::make_list(std::move(out));
}

Result<Value> f_first(Interpreter&, const Value& v, const CallArgs&) {
  Generator::Step pull = iterator_of(v);  // next(iter(v)): takes one item of a generator
  RILL_ASSIGN_OR_RETURN(std::optional<Value> item, pull());
  if (!item) return Value::undefined("No first item, sequence was empty.");
  return *item;
}

Result<Value> f_last(Interpreter&, const Value& v, const CallArgs&) {
  if (v.kind == Kind::kGenerator) return Error{"'generator' object is not reversible"};
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Result<Value> f_items(Interpreter&, const Value& v, const CallArgs&) {
  size_t pos = 0;
  return make_generator(v, [v, pos]() mutable -> Result<std::optional<Value>> {
    if (v.is_undefined()) return std::optional<Value>();
    if (v.kind != Kind::kDict) return Error{"Can only get item pairs from a mapping."};
    if (pos >= v.dict->items.size()) return std::optional<Value>();
    const auto& [k, val] = v.dict->items[pos++];
    return std::optional<Value>(Value::make_tuple({k, val}));
  });
}

Result<Value> f_join(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* sep = a.get(0, "d");
  const Value* attribute = a.get(1, "attribute");
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  std::string out;
  const std::string separator = sep ? text_of(*sep) : "";
  for (size_t k = 0; k < items.size(); ++k) {
    Value item = items[k];
    if (attribute && !attribute->is_none()) {
      RILL_ASSIGN_OR_RETURN(item, attribute_of(in, item, *attribute, nullptr));
    }
    if (k) out += separator;
    out += text_of(item);
    RILL_TRY(in.check_bytes(out.size()));
  }
  return Value::string(std::move(out));
}

Result<int64_t> py_len(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return int64_t(n_code_points(v.s()));
    case Kind::kList:
    case Kind::kTuple:
      return int64_t(v.list->size());
    case Kind::kDict:
      return int64_t(v.dict->items.size());
    default:
      return Error{"object of type '" + type_name(v) + "' has no len()"};
  }
}

Result<Value> f_length(Interpreter&, const Value& v, const CallArgs&) {
  RILL_ASSIGN_OR_RETURN(int64_t n, py_len(v));
  return Value::integer(n);
}

Result<Value> f_list(Interpreter&, const Value& v, const CallArgs&) {
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  return Value::make_list(std::move(items));
}

Result<Value> f_map(Interpreter& in, const Value& v, const CallArgs& a) {
  Interpreter* interp = &in;
  bool started = false;
  Generator::Step pull;
  return make_generator(v, [=]() mutable -> Result<std::optional<Value>> {
    if (!started) {
      started = true;
      if (!truthy(v)) return std::optional<Value>();
      const bool by_attr = a.positional.empty() && a.kw("attribute");
      if (by_attr) {
        for (const auto& [key, value] : a.keyword)
          if (key != "attribute" && key != "default") return Error{"Unexpected keyword argument '" + key + "'"};
      } else if (a.positional.empty()) {
        return Error{"map requires a filter argument"};
      }
      pull = iterator_of(v);
    }
    if (!pull) return std::optional<Value>();
    RILL_ASSIGN_OR_RETURN(std::optional<Value> item, pull());
    if (!item) return item;
    if (a.positional.empty()) {
      const Value* dflt = a.kw("default");
      if (dflt && dflt->is_none()) dflt = nullptr;
      RILL_ASSIGN_OR_RETURN(Value x, attribute_of(*interp, *item, *a.kw("attribute"), dflt));
      return std::optional<Value>(std::move(x));
    }
    if (a.positional[0].kind != Kind::kString) return Error{"no filter named " + repr(a.positional[0])};
    CallArgs rest;
    rest.positional.assign(a.positional.begin() + 1, a.positional.end());
    rest.keyword = a.keyword;
    RILL_ASSIGN_OR_RETURN(Value x, interp->filter(a.positional[0].s(), *item, rest));
    return std::optional<Value>(std::move(x));
  });
}

Result<Value> f_max(Interpreter& in, const Value& v, const CallArgs& a) {
  return min_max(in, v, a, true);
}

Result<Value> f_min(Interpreter& in, const Value& v, const CallArgs& a) {
  return min_max(in, v, a, false);
}

Result<Value> f_select(Interpreter& in, const Value& v, const CallArgs& a) {
  return select_impl(in, v, a, true, false);
}

Result<Value> f_reject(Interpreter& in, const Value& v, const CallArgs& a) {
  return select_impl(in, v, a, false, false);
}

Result<Value> f_selectattr(Interpreter& in, const Value& v, const CallArgs& a) {
  return select_impl(in, v, a, true, true);
}

Result<Value> f_rejectattr(Interpreter& in, const Value& v, const CallArgs& a) {
  return select_impl(in, v, a, false, true);
}

Result<Value> f_reverse(Interpreter&, const Value& v, const CallArgs&) {
  if (v.kind == Kind::kString) {
    std::u32string cps = decode_utf8(v.s());
    std::reverse(cps.begin(), cps.end());
    return Value::string(encode_utf8(cps));
  }
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  std::reverse(items.begin(), items.end());
  return Value::generator(std::move(items));
}

// jinja's make_multi_attrgetter: the key is a list of one value per
// comma-separated attribute, so ties compare with == before <.
Result<Value> f_sort(Interpreter& in, const Value& v, const CallArgs& a) {
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  const bool case_sensitive = arg_true(a, 1, "case_sensitive");
  const Value* attribute = a.get(2, "attribute");
  std::vector<std::optional<Value>> parts;  // nullopt: the item itself
  if (attribute && attribute->kind == Kind::kString) {
    for (const std::string& p : py_split(attribute->s(), std::string(","), -1, false))
      parts.emplace_back(Value::string(p));
  } else if (attribute && !attribute->is_none()) {
    parts.emplace_back(*attribute);
  } else {
    parts.emplace_back(std::nullopt);
  }
  List keys;
  for (const auto& item : items) {
    List key;
    for (const auto& part : parts) {
      Value k = item;
      if (part) {
        RILL_ASSIGN_OR_RETURN(k, attribute_of(in, item, *part, nullptr));
      }
      key.push_back(case_sensitive ? k : ignore_case(k));
    }
    keys.push_back(Value::make_list(std::move(key)));
  }
  RILL_ASSIGN_OR_RETURN(auto order, sorted_order(keys, arg_true(a, 0, "reverse")));
  List out;
  for (size_t i : order) out.push_back(items[i]);
  return Value::make_list(std::move(out));
}

Result<Value> f_sum(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* attribute = a.get(0, "attribute");
  const Value* start = a.get(1, "start");
  RILL_ASSIGN_OR_RETURN(List items, iterate(v));
  Value total = start ? *start : Value::integer(0);
  for (const auto& item : items) {
    Value x = item;
    if (attribute && !attribute->is_none()) {
      RILL_ASSIGN_OR_RETURN(x, attribute_of(in, item, *attribute, nullptr));
    }
    RILL_ASSIGN_OR_RETURN(total, in.binary("+", total, x));
  }
  return total;
}

Result<Value> f_unique(Interpreter& in, const Value& v, const CallArgs& a) {
  Interpreter* interp = &in;
  const Value* attr_arg = a.get(1, "attribute");
  const Value attribute = attr_arg ? *attr_arg : Value::none();
  const bool case_sensitive = arg_true(a, 0, "case_sensitive");
  Generator::Step pull;
  List seen;
  return make_generator(v, [=]() mutable -> Result<std::optional<Value>> {
    if (!pull) pull = iterator_of(v);
    while (true) {
      RILL_ASSIGN_OR_RETURN(std::optional<Value> item, pull());
      if (!item) return item;
      Value key = *item;
      if (!attribute.is_none()) {
        RILL_ASSIGN_OR_RETURN(key, attribute_of(*interp, *item, attribute, nullptr));
      }
      if (!case_sensitive) key = ignore_case(key);
      if (key.kind == Kind::kList || key.kind == Kind::kDict || key.kind == Kind::kObject)
        return Error{"unhashable type: '" + type_name(key) + "'"};
      bool dup = false;
      for (const auto& s : seen) dup = dup || equals(s, key);
      if (dup) continue;
      seen.push_back(std::move(key));
      return item;
    }
  });
}

}  // namespace rill::jinja::filters
