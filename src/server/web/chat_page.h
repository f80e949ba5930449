#pragma once
// The chat page served at "/": one self-contained HTML file (CSS and JS
// inline, no build step) that talks to /v1/chat/completions with streaming.
#include <string>

namespace rill::server {

const std::string& chat_page_html();

}  // namespace rill::server
