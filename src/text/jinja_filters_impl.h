#pragma once
// Internal to the filter implementation (jinja_filters.cpp: text, numbers,
// the filter table; jinja_filters_seq.cpp: sequences and mappings).
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja_builtins.h"

namespace rill::jinja::filters {

using FilterFn = Result<Value> (*)(Interpreter&, const Value&, const CallArgs&);

bool arg_true(const CallArgs& a, size_t i, std::string_view name, bool dflt = false);
Result<int64_t> arg_int(const CallArgs& a, size_t i, std::string_view name, int64_t dflt);
// str() as jinja's soft_str applies it (Undefined -> "").
std::string text_of(const Value& v);

// Python len(): an Error for values without one (generators, numbers).
Result<int64_t> py_len(const Value& v);

// Sequence and mapping filters (jinja_filters_seq.cpp).
Result<Value> f_batch(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_dictsort(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_first(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_last(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_items(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_join(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_length(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_list(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_map(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_max(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_min(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_select(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_reject(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_selectattr(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_rejectattr(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_reverse(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_sort(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_sum(Interpreter& in, const Value& v, const CallArgs& a);
Result<Value> f_unique(Interpreter& in, const Value& v, const CallArgs& a);

}  // namespace rill::jinja::filters
