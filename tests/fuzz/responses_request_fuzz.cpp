// Fuzz target for the /v1/responses request reader: parse_responses_request
// on the body text, then what the handler does with an accepted request
// without a model: items -> chat messages, the Response skeleton, and a
// round trip through the response store (which dumps it), and the same bytes
// as the query string of GET /v1/responses/{id}/input_items over the items.
// Input: the body. Checks: errors are 400s naming their field; metadata
// keeps OpenAI's shape; an input_items page is a list within its limit.
#include <cstdint>
#include <string>

#include "request_fuzz_util.h"
#include "server/response_store.h"
#include "server/responses_convert.h"

namespace {

// The input as a query string over a small stored conversation.
void check_input_items_query(const std::string& query) {
  using namespace rill::server;
  nlohmann::ordered_json items = nlohmann::ordered_json::array();
  for (int i = 0; i < 3; ++i) items.push_back({{"type", "message"}, {"role", "user"}, {"content", "x"}});
  assign_item_ids(items);
  auto page = input_items_page(items, query);
  if (auto* e = std::get_if<ApiError>(&page)) {
    rill::fuzz::check_request_error(*e);
    return;
  }
  const auto& list = std::get<nlohmann::ordered_json>(page);
  FUZZ_CHECK(list["object"] == "list" && list["data"].size() <= items.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rill::server;
  const std::string text(reinterpret_cast<const char*>(data), size);
  check_input_items_query(text);
  auto parsed = parse_responses_request(text);
  if (auto* e = std::get_if<ApiError>(&parsed)) {
    rill::fuzz::check_request_error(*e);
    return 0;
  }
  const ResponsesRequest& req = std::get<ResponsesRequest>(parsed);
  FUZZ_CHECK(req.metadata.is_object() && req.metadata.size() <= 16);
  for (const auto& [k, v] : req.metadata.items()) FUZZ_CHECK(v.is_string());
  const auto messages = items_to_messages(req.instructions.value_or(""), req.input_items);
  FUZZ_CHECK(messages.is_array());
  rill::SamplingParams sampling;
  auto skeleton = response_skeleton(req, "resp_fuzz", 0, "fuzz", req.instructions.value_or(""), sampling);
  ResponseStore store(0, 1 << 20);
  StoredResponse entry;
  entry.response = std::move(skeleton);
  entry.input_items = req.input_items;
  if (store.put("resp_fuzz", std::move(entry))) FUZZ_CHECK(store.get("resp_fuzz") != nullptr);
  (void)dump_responses_json(messages);
  return 0;
}
